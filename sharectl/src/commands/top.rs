//! `sharectl top`: a live view of the node in the manner of `nvtop`, drawn with ratatui
//! (crossterm backend): per device and per container memory used / quota, class, the gate the
//! daemon wrote (budget), and rates from the counters between two refreshes (every second):
//! launches per second, GPU time per second (measured by the shims of opportunistic containers
//! only: production launches are not timed), time held at the gate per second (throttled).
//! Everything comes from the state files through `libshare_node::view`, so it works with or
//! without the daemon. `q`, Esc or Ctrl-C quits and restores the terminal; `--once` prints one
//! plain table (no terminal needed).

use anyhow::{anyhow, Result};
use clap::Args;
use libshare_abi::names::escape;
use libshare_abi::units::format_size;
use libshare_node::view::{self, gate_parts, DeviceView, NodeView};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Refresh period (100ms..1min).
    #[arg(long, default_value = "1s", value_parser = crate::commands::daemon::parse_duration)]
    pub interval: u64,
    /// Print one table (rates over one --interval) and exit, without the full-screen view.
    #[arg(long)]
    pub once: bool,
}

/// Rates of one (container, device) between two reads, per second of wall time.
#[derive(Clone, Copy, Debug, Default)]
struct Rates {
    launches: f64,
    /// GPU seconds per second (a fraction of the device; timed jobs only).
    gpu: f64,
    /// Seconds held at the gate per second (summed over threads: may exceed 1).
    throttled: f64,
}

/// Per (container, device).
type ByDevice<T> = HashMap<(String, usize), T>;

/// The cumulative counters rates are taken from: launches, gpu_ns, held_ns.
type Totals = (u64, u64, u64);

/// Two successive reads: the latest and the counters of the one before.
struct Sampler {
    dir: PathBuf,
    /// When the last read was, and its (launches, gpu_ns, held_ns).
    last: Option<(Instant, ByDevice<Totals>)>,
}

impl Sampler {
    fn read(&mut self) -> Result<(NodeView, ByDevice<Rates>)> {
        let v = view::read(&self.dir)?;
        let now = Instant::now();
        let counters: HashMap<_, _> = v
            .containers
            .iter()
            .flat_map(|c| {
                c.devices.iter().map(|d| {
                    (
                        (c.name.clone(), d.device),
                        (d.launches, d.gpu_ns, d.held_ns),
                    )
                })
            })
            .collect();
        let mut rates = HashMap::new();
        if let Some((t0, before)) = &self.last {
            let dt = now.duration_since(*t0).as_secs_f64().max(1e-3);
            for (k, (l, g, h)) in &counters {
                if let Some((l0, g0, h0)) = before.get(k) {
                    rates.insert(
                        k.clone(),
                        Rates {
                            launches: l.saturating_sub(*l0) as f64 / dt,
                            gpu: g.saturating_sub(*g0) as f64 / 1e9 / dt,
                            throttled: h.saturating_sub(*h0) as f64 / 1e9 / dt,
                        },
                    );
                }
            }
        }
        self.last = Some((now, counters));
        Ok((v, rates))
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn quota_str(q: u64) -> String {
    if q == 0 {
        "none".into()
    } else {
        format_size(q)
    }
}

/// A text bar of `width` cells for `frac` (0..=1).
fn bar(frac: f64, width: usize) -> String {
    let n = ((frac.clamp(0.0, 1.0)) * width as f64).round() as usize;
    format!("{}{}", "█".repeat(n), "·".repeat(width - n))
}

/// The gate as the budget column shows it.
fn budget(d: &DeviceView) -> String {
    let (state, bound_us, window, share) = gate_parts(d.gate);
    let mut s = state.to_string();
    if state == "run" {
        if bound_us > 0 {
            s += &if bound_us >= 1000 {
                format!(" ≤{}ms", bound_us as f64 / 1000.0)
            } else {
                format!(" ≤{bound_us}us")
            };
        }
        if window {
            s += " win";
        }
        if share {
            s += " share";
        }
    }
    if d.compute_bp > 0 {
        s += &format!(" {}%", d.compute_bp as f64 / 100.0);
    }
    s
}

const HEADERS: [&str; 14] = [
    "CONTAINER",
    "CLASS",
    "GPU",
    "USED",
    "QUOTA",
    "MEM",
    "LAUNCH/s",
    "GPU TIME/s",
    "THROTTLED/s",
    "GATE",
    "RESIDENT",
    "DEMOTED",
    "MIGR",
    "PROCS",
];

/// One row per (container, device); a container on no device gets one row of dashes. Names
/// are [`escape`]d (a directory named by hand cannot send terminal sequences).
fn container_rows(v: &NodeView, rates: &ByDevice<Rates>) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for c in &v.containers {
        let procs = c.processes.len().to_string();
        let name = escape(&c.name).into_owned();
        if c.devices.is_empty() {
            let mut r = vec![name.clone(), c.class.name().into()];
            r.extend(std::iter::repeat_n("-".to_string(), 11));
            r.push(procs.clone());
            rows.push(r);
        }
        for d in &c.devices {
            let rate = rates.get(&(c.name.clone(), d.device));
            let mem = if d.quota > 0 {
                let f = d.used as f64 / d.quota as f64;
                format!("{} {}", bar(f, 10), pct(f))
            } else {
                "-".into()
            };
            let gpu = match (c.class, rate) {
                (libshare_abi::Class::Production, _) => "untimed".into(),
                (_, Some(r)) => pct(r.gpu),
                (_, None) => "-".into(),
            };
            rows.push(vec![
                name.clone(),
                c.class.name().into(),
                d.device.to_string(),
                format_size(d.used),
                quota_str(d.quota),
                mem,
                rate.map_or("-".into(), |r| format!("{:.0}", r.launches)),
                gpu,
                rate.map_or("-".into(), |r| format!("{:.2}s", r.throttled)),
                budget(d),
                format_size(d.resident()),
                format_size(d.demoted),
                d.migrations.to_string(),
                procs.clone(),
            ]);
        }
    }
    rows
}

/// Per device: memory held by all containers, sum of their quotas, containers, launches/s.
fn device_lines(v: &NodeView, rates: &ByDevice<Rates>) -> Vec<String> {
    let mut devs: std::collections::BTreeMap<usize, (u64, u64, usize, f64, f64)> =
        Default::default();
    for c in &v.containers {
        for d in &c.devices {
            let e = devs.entry(d.device).or_default();
            e.0 += d.used;
            e.1 += d.quota;
            e.2 += 1;
            if let Some(r) = rates.get(&(c.name.clone(), d.device)) {
                e.3 += r.launches;
                e.4 += r.throttled;
            }
        }
    }
    devs.iter()
        .map(|(d, (used, quotas, n, l, t))| {
            format!(
                "GPU {d}: {} held by {n} container(s), quotas {}, {:.0} launches/s, {:.2}s/s throttled",
                format_size(*used),
                format_size(*quotas),
                l,
                t
            )
        })
        .collect()
}

const LEGEND: &str = "GPU TIME/s: GPU time measured by opportunistic shims per second (production launches are untimed) · THROTTLED/s: time launches waited at the gate per second · GATE: the daemon's budget · RESIDENT/DEMOTED: memory on the device / demoted to the host (oversubscribing containers) · MIGR: allocations moved between them";

fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    crate::commands::state_dir(arg)
}

pub fn run(args: TopArgs) -> Result<()> {
    if !(100_000_000..=60_000_000_000).contains(&args.interval) {
        return Err(anyhow!("--interval must be between 100ms and 1min"));
    }
    let dir = state_dir(args.state_dir);
    let interval = Duration::from_nanos(args.interval);
    let mut s = Sampler {
        dir: dir.clone(),
        last: None,
    };
    if args.once {
        s.read()?;
        std::thread::sleep(interval);
        let (v, rates) = s.read()?;
        for l in plain(&dir, &v, &rates) {
            println!("{l}");
        }
        for e in &v.errors {
            eprintln!("sharectl: {}", escape(e));
        }
        return Ok(());
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return Err(anyhow!(
            "sharectl top needs a terminal: use `sharectl top --once` for a plain print"
        ));
    }
    let mut term = ratatui::try_init().map_err(|e| anyhow!("cannot set up the terminal: {e}"))?;
    let r = live(&mut term, &mut s, &dir, interval);
    let restored = ratatui::try_restore();
    r?;
    restored.map_err(|e| anyhow!("cannot restore the terminal: {e}"))
}

fn plain(dir: &Path, v: &NodeView, rates: &ByDevice<Rates>) -> Vec<String> {
    let mut out = vec![format!(
        "libshare top — {}",
        escape(&dir.display().to_string())
    )];
    out.extend(device_lines(v, rates));
    let rows = container_rows(v, rates);
    let mut w: Vec<usize> = HEADERS.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let fmt = |r: &[String]| {
        r.iter()
            .enumerate()
            .map(|(i, c)| format!("{c}{}", " ".repeat(w[i] - c.chars().count())))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    out.push(fmt(&HEADERS.map(String::from)));
    out.extend(rows.iter().map(|r| fmt(r)));
    if v.containers.is_empty() {
        out.push("no containers (none has used CUDA with libshare yet)".into());
    }
    out
}

fn live(
    term: &mut ratatui::DefaultTerminal,
    s: &mut Sampler,
    dir: &Path,
    interval: Duration,
) -> Result<()> {
    loop {
        let (v, rates) = s.read()?;
        term.draw(|f| draw(f, dir, &v, &rates))?;
        let next = Instant::now() + interval;
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if event::poll(left)? {
                if let Event::Key(k) = event::read()? {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press
                        && (ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc))
                    {
                        return Ok(());
                    }
                }
                // A resize (or any other event) redraws at the next refresh.
            }
        }
    }
}

fn draw(f: &mut ratatui::Frame, dir: &Path, v: &NodeView, rates: &ByDevice<Rates>) {
    let devices = device_lines(v, rates);
    let [head, devs, table, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(devices.len().max(1) as u16 + 2),
        Constraint::Min(3),
        Constraint::Length(2),
    ])
    .areas(f.area());
    let errors = if v.errors.is_empty() {
        String::new()
    } else {
        format!(
            "  ({} state file(s) unreadable: see sharectl status)",
            v.errors.len()
        )
    };
    f.render_widget(
        Paragraph::new(format!(
            "libshare top — {} — {} container(s){errors}   q: quit",
            escape(&dir.display().to_string()),
            v.containers.len()
        ))
        .style(Style::default().add_modifier(Modifier::BOLD)),
        head,
    );
    let dev_text: Vec<Line> = if devices.is_empty() {
        vec![Line::from("no device in use")]
    } else {
        devices.into_iter().map(Line::from).collect()
    };
    f.render_widget(
        Paragraph::new(dev_text).block(Block::default().borders(Borders::ALL).title(" devices ")),
        devs,
    );
    let rows = container_rows(v, rates);
    let widths = [
        Constraint::Min(12),
        Constraint::Length(13),
        Constraint::Length(3),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(15),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(11),
        Constraint::Min(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(5),
        Constraint::Length(5),
    ];
    let header = Row::new(HEADERS.map(Cell::from)).style(
        Style::default()
            .fg(Color::Black)
            .bg(Color::Cyan)
            .add_modifier(Modifier::BOLD),
    );
    let body: Vec<Row> = if rows.is_empty() {
        vec![Row::new([Cell::from(
            "no containers (none has used CUDA with libshare yet)",
        )])]
    } else {
        rows.into_iter()
            .map(|r| {
                let color = if r[1] == "opportunistic" {
                    Color::Yellow
                } else {
                    Color::Green
                };
                Row::new(r.into_iter().map(Cell::from)).style(Style::default().fg(color))
            })
            .collect()
    };
    f.render_widget(
        Table::new(body, widths)
            .header(header)
            .block(Block::default().borders(Borders::ALL).title(" containers ")),
        table,
    );
    f.render_widget(
        Paragraph::new(LEGEND)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .style(Style::default().fg(Color::DarkGray)),
        foot,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::Class;
    use libshare_node::view::ContainerView;

    #[test]
    fn rows_show_memory_class_and_rates() {
        let dir = tempfile::tempdir().unwrap();
        let st =
            libshare_abi::State::open_or_create(&libshare_abi::container_dir(dir.path(), "job"))
                .unwrap();
        st.set_quota(0, 1 << 30);
        st.device(0)
            .used
            .store(1 << 29, std::sync::atomic::Ordering::Release);
        // 192 MiB of it demoted to the host, in 3 moves.
        st.device(0)
            .demoted
            .store(192 << 20, std::sync::atomic::Ordering::Release);
        st.device(0)
            .migrations
            .store(3, std::sync::atomic::Ordering::Release);
        let v = view::read(dir.path()).unwrap();
        assert_eq!(v.containers[0].class, Class::Production);
        let mut rates = HashMap::new();
        rates.insert(
            ("job".to_string(), 0),
            Rates {
                launches: 10.0,
                gpu: 0.0,
                throttled: 0.5,
            },
        );
        let rows = container_rows(&v, &rates);
        assert_eq!(rows.len(), 1);
        assert_eq!(
            &rows[0][..5],
            ["job", "production", "0", "512 MiB", "1 GiB"]
        );
        assert!(rows[0][5].ends_with("50%"), "{:?}", rows[0][5]);
        assert_eq!(rows[0][7], "untimed");
        assert_eq!(rows[0][8], "0.50s");
        assert_eq!(&rows[0][10..13], ["320 MiB", "192 MiB", "3"]);
        let text = plain(dir.path(), &v, &rates).join("\n");
        assert!(
            text.contains("GPU 0: 512 MiB held by 1 container(s)"),
            "{text}"
        );
        let _ = ContainerView::clone(&v.containers[0]);
    }
}
