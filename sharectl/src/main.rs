//! `sharectl`: libshare's node daemon and admin CLI.
//!
//! Every subcommand is `commands/<subcommand>.rs`: its clap `Args` and a `run` over a library —
//! `libshare-node`/`libshare-abi` (`daemon`, `set`/`get`/`reset`, `status`, `top`, `health`),
//! `containers/` (the container edits, the OCI types, the bind to the daemon, owned by no
//! command) and crate `libshare-k8s` (`cdi`, `hook`, `runtime`, `device-plugin`, `dra-plugin`),
//! or the command's own module: `bench/` (one file per scenario), `demo/` (its run apart from
//! its view), `gpu_check/` (a GPU node's check and simgpu's calibration, issue 33).

mod admin;
mod bench;
mod child;
mod commands;
mod containers;
mod daemon_child;
mod demo;
mod gpu_check;
mod node_view;
mod platform;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// libshare: share one GPU between production and opportunistic jobs, unmodified.
#[derive(Parser, Debug)]
#[command(name = "sharectl", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// A production and an opportunistic job sharing the GPU (simgpu when there is none) under the
    /// shim, with live throughput and per-container memory.
    Demo(commands::demo::DemoArgs),
    /// Sharing scenarios (issue 9) under every policy: one result line per scenario and policy.
    Bench(commands::bench::BenchArgs),
    /// What every container holds: memory used/quota/peak per GPU, class, processes.
    Status(commands::status::StatusArgs),
    /// The node daemon: steers every container's GPU gate each period until SIGTERM.
    Daemon(commands::daemon::DaemonArgs),
    /// Set a container's memory quota, compute share, weight or class, through the daemon.
    ///
    /// The daemon writes it into the container's state (created if the container has not
    /// started yet, so the setting is in place before its first allocation or launch) and keeps
    /// it across restarts. `--offline` writes the state file directly, without a daemon.
    Set(commands::set::SetArgs),
    /// Show a container's settings and what its state holds (quota, used, share), from the daemon.
    Get(commands::set::NameArgs),
    /// Forget the daemon's settings for a container (the defaults apply; its quota stays until
    /// a job of the container starts with its own limit).
    Reset(commands::set::NameArgs),
    /// A live view of the node (in the manner of nvtop): per device and container memory,
    /// class, gate, launch rate, GPU time and throttled time; refreshes every second, q quits.
    Top(commands::top::TopArgs),
    /// Container Device Interface: `cdi generate` writes the spec that makes podman, CRI-O,
    /// containerd >= 1.7 and Docker >= 25 inject libshare into containers asking for
    /// libshare.dev/gpu=<i>|all.
    #[command(subcommand)]
    Cdi(commands::cdi::CdiCommand),
    /// OCI hook (createRuntime): injects libshare into the container whose state is on stdin
    /// (runc config.json hooks, podman/CRI-O hooks.d: --print-hooks-d).
    Hook(commands::hook::HookArgs),
    /// runc wrapper (`sharectl runtime [OPTIONS] -- RUNC-ARGS`): adds the hook to containers
    /// asking for a shared GPU (LIBSHARE_VISIBLE_DEVICES or annotation libshare.dev/gpu), then
    /// execs runc with its arguments unchanged.
    #[command(disable_help_flag = true)]
    Runtime(commands::runtime::RuntimeCli),
    /// Kubernetes device plugin (kubelet API v1beta1): advertises each GPU as memory shares
    /// (libshare.dev/gpu-memory), answers Allocate with a CDI device whose hook binds the
    /// allocation's quota and the pod's class to the container on the daemon.
    DevicePlugin(commands::device_plugin::DevicePluginArgs),
    /// Kubernetes DRA kubelet plugin, driver gpu.libshare.dev: publishes each GPU as a
    /// shareable device (consumable memory and compute) and prepares claims: the memory a claim
    /// consumes becomes its containers' quota, its DeviceClass their class.
    DraPlugin(commands::dra_plugin::DraPluginArgs),
    /// Exit 0 when the daemon answers on its admin socket within 5 s (a liveness probe).
    Health(commands::health::HealthArgs),
    /// libshare on this machine's NVIDIA GPU, and simgpu calibrated against it (issue 33):
    /// scripts/gpu-check.sh runs it from a bundle.
    GpuCheck(commands::gpu_check::GpuCheckArgs),
}

/// SIGPIPE's disposition: default (a write to a closed pipe ends the process quietly, as it
/// ends `cat`), or ignored (the write fails with EPIPE instead).
fn sigpipe(default: bool) {
    let how = if default {
        libc::SIG_DFL
    } else {
        libc::SIG_IGN
    };
    // SAFETY: setting a signal's disposition to SIG_DFL or SIG_IGN installs no handler code.
    unsafe { libc::signal(libc::SIGPIPE, how) };
}

fn main() -> ExitCode {
    // Rust's runtime ignores SIGPIPE, so a `println!` into a closed pipe panics: `sharectl get X
    // | head -1` would print a panic. The default disposition ends the process quietly instead
    // (exit status 141 in a shell), for the help text as for every printing command.
    sigpipe(true);
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Daemon(_)
            | Command::Demo(_)
            | Command::Bench(_)
            | Command::DevicePlugin(_)
            | Command::DraPlugin(_)
            | Command::GpuCheck(_)
    ) {
        // The daemon must outlive a client that closes its socket early (its sockets are
        // written with MSG_NOSIGNAL, but its metrics' TCP writes are not); the demo and the
        // bench stop or carry on their own when stdout goes away, cleaning up their jobs and
        // private daemon, which a SIGPIPE would orphan.
        sigpipe(false);
    }
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Status(args) => commands::status::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Daemon(args) => commands::daemon::run(args),
        Command::Set(args) => commands::set::run(args),
        Command::Get(args) => commands::set::get_or_reset(args, false),
        Command::Reset(args) => commands::set::get_or_reset(args, true),
        Command::Top(args) => commands::top::run(args),
        Command::Cdi(cmd) => commands::cdi::run(cmd),
        Command::Hook(args) => commands::hook::run(args),
        Command::Runtime(args) => commands::runtime::run(args),
        Command::DevicePlugin(args) => commands::device_plugin::run(args),
        Command::DraPlugin(args) => commands::dra_plugin::run(args),
        Command::Health(args) => commands::health::run(args),
        Command::GpuCheck(args) => commands::gpu_check::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Like other Unix tools, stop quietly when the reader of stdout goes away.
        Err(e) if e.downcast_ref::<demo::StdoutClosed>().is_some() => ExitCode::from(141),
        Err(e) => {
            eprintln!("sharectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn demo_args() {
        let cli = Cli::try_parse_from(["sharectl", "demo"]).unwrap();
        let Command::Demo(a) = cli.command else {
            panic!("demo")
        };
        assert_eq!(a.duration, 5.0);
        assert!(!a.platform.sim && !a.json);
        let cli = Cli::try_parse_from([
            "sharectl",
            "demo",
            "--sim",
            "--duration",
            "2.5",
            "--json",
            "--simgpu-lib",
            "/x",
        ])
        .unwrap();
        let Command::Demo(a) = cli.command else {
            panic!("demo")
        };
        assert_eq!(a.duration, 2.5);
        assert!(a.platform.sim && a.json);
        assert_eq!(
            a.platform.simgpu_lib.as_deref(),
            Some(std::path::Path::new("/x"))
        );
        assert!(a.shim.is_none() && !a.no_shim);
        let cli = Cli::try_parse_from(["sharectl", "demo", "--shim", "/l/libshare.so"]).unwrap();
        let Command::Demo(a) = cli.command else {
            panic!("demo")
        };
        assert_eq!(
            a.shim.as_deref(),
            Some(std::path::Path::new("/l/libshare.so"))
        );
        assert!(Cli::try_parse_from(["sharectl", "demo", "--no-shim", "--shim", "/x"]).is_err());
        assert!(Cli::try_parse_from(["sharectl", "demo", "--duration", "0"]).is_err());
        assert!(Cli::try_parse_from(["sharectl", "demo", "--duration", "abc"]).is_err());
        assert!(Cli::try_parse_from(["sharectl"]).is_err());
    }
}
