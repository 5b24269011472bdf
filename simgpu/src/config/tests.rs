use super::*;
use std::io::Write;

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(pairs: &[(&str, &str)]) -> Result<SimConfig, ConfigError> {
    SimConfig::from_vars(&vars(pairs))
}

fn error(pairs: &[(&str, &str)]) -> String {
    match load(pairs) {
        Ok(cfg) => panic!("expected an error for {pairs:?}, got {cfg:?}"),
        Err(e) => {
            assert!(!e.0.contains('\n'), "error is not one line: {e}");
            assert!(e.0.starts_with("simgpu: "), "{e}");
            e.0
        }
    }
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile()
        .expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    file
}

fn path_of(file: &tempfile::NamedTempFile) -> String {
    file.path().to_str().expect("utf-8 temp path").to_owned()
}

#[test]
fn sizes() {
    assert_eq!(parse_size("1073741824"), Some(1 << 30));
    assert_eq!(parse_size("40GiB"), Some(40 << 30));
    assert_eq!(parse_size("512MiB"), Some(512 << 20));
    assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
    assert_eq!(parse_size("2KiB"), Some(2048));
    assert_eq!(parse_size("1TiB"), Some(1 << 40));
    assert_eq!(parse_size("40GB"), Some(40_000_000_000));
    assert_eq!(parse_size("512MB"), Some(512_000_000));
    assert_eq!(parse_size("3kB"), Some(3000));
    assert_eq!(parse_size("16 gib"), Some(16 << 30));
    assert_eq!(parse_size(" 7B "), Some(7));
    assert_eq!(parse_size("0"), Some(0));
    assert_eq!(parse_size("0.1KiB"), Some(102)); // truncated
    for bad in [
        "",
        "banana",
        "GiB",
        "1.5",
        "1.",
        ".5GiB",
        "-1GiB",
        "+1GiB",
        "1 .5GiB",
        "1..5GiB",
        "40G",
        "40GiBs",
        "1e9",
        "99999999999999999999",
        "20000000TiB",
    ] {
        assert_eq!(parse_size(bad), None, "{bad:?}");
    }
}

#[test]
fn durations() {
    assert_eq!(parse_duration_ns("200ns"), Some(200));
    assert_eq!(parse_duration_ns("5us"), Some(5_000));
    assert_eq!(parse_duration_ns("5µs"), Some(5_000));
    assert_eq!(parse_duration_ns("1ms"), Some(1_000_000));
    assert_eq!(parse_duration_ns("1.5ms"), Some(1_500_000));
    assert_eq!(parse_duration_ns("2s"), Some(2_000_000_000));
    assert_eq!(parse_duration_ns("0.25 s"), Some(250_000_000));
    for bad in [
        "", "5", "1m", "1h", "ms", "1.5.5ms", "-1ms", "five ms", "1e3ns",
    ] {
        assert_eq!(parse_duration_ns(bad), None, "{bad:?}");
    }
}

#[test]
fn bandwidths() {
    assert_eq!(parse_bandwidth("25GB/s"), Some(25_000_000_000));
    assert_eq!(parse_bandwidth("12GiB/s"), Some(12 << 30));
    assert_eq!(parse_bandwidth("1.5 TB/s"), Some(1_500_000_000_000));
    assert_eq!(parse_bandwidth("1000/s"), Some(1000));
    for bad in ["", "25GB", "/s", "fast/s", "25GB/h"] {
        assert_eq!(parse_bandwidth(bad), None, "{bad:?}");
    }
}

#[test]
fn uuids() {
    let text = "GPU-01234567-89ab-cdef-0123-456789ABCDEF";
    let uuid = parse_uuid(text).expect("valid uuid");
    assert_eq!(uuid[0], 0x01);
    assert_eq!(uuid[15], 0xef);
    assert_eq!(
        format_uuid(&uuid),
        text.to_ascii_lowercase().replace("gpu-", "GPU-")
    );
    for bad in [
        "01234567-89ab-cdef-0123-456789abcdef",
        "GPU-0123456-789ab-cdef-0123-456789abcdef",
        "GPU-01234567-89ab-cdef-0123-456789abcdeg",
        "GPU-+1234567-89ab-cdef-0123-456789abcdef",
        "GPU-01234567-89ab-cdef-0123",
    ] {
        assert_eq!(parse_uuid(bad), None, "{bad:?}");
    }
    assert_eq!(format_uuid(&DeviceConfig::a100(0).uuid).len(), 40);
}

#[test]
fn compute_capabilities_and_launch_errors() {
    assert_eq!(parse_compute_capability("8.0"), Some((8, 0)));
    assert_eq!(parse_compute_capability("9"), Some((9, 0)));
    for bad in ["", "0.0", "21.0", "8.10", "8.", ".8", "a.b"] {
        assert_eq!(parse_compute_capability(bad), None, "{bad:?}");
    }
    assert_eq!(parse_launch_error("5:719"), Some((5, 719)));
    for bad in ["", "5", "0:719", "5:0", "5:x", ":719"] {
        assert_eq!(parse_launch_error(bad), None, "{bad:?}");
    }
}

#[test]
fn no_variables_give_defaults() {
    let cfg = load(&[]).expect("defaults");
    assert_eq!(cfg, SimConfig::default());
    // Empty values count as unset.
    let cfg = load(&[("SIMGPU_MEMORY", ""), ("SIMGPU_CONFIG", " ")]).expect("defaults");
    assert_eq!(cfg, SimConfig::default());
}

#[test]
fn every_variable() {
    let cfg = load(&[
        ("SIMGPU_DEVICES", "3"),
        ("SIMGPU_DEVICE_NAME", "Simulated H100"),
        ("SIMGPU_MEMORY", "80GiB"),
        ("SIMGPU_SMS", "132"),
        ("SIMGPU_CC", "9.0"),
        ("SIMGPU_DRIVER_VERSION", "12040"),
        ("SIMGPU_STATE_DIR", "/tmp/simgpu-x"),
        ("SIMGPU_LOG", "debug"),
        ("SIMGPU_KERNEL_BASE", "3us"),
        ("SIMGPU_WAVE", "1.5ms"),
        ("SIMGPU_KERNEL_TIME", "gemm=1ms, _Z6kernelPf=250us"),
        ("SIMGPU_PCIE_BW", "12GiB/s"),
        ("SIMGPU_HBM_BW", "3TB/s"),
        ("SIMGPU_FAIL_ALLOC_NTH", "3"),
        ("SIMGPU_LAUNCH_ERROR", "5:719"),
        ("SIMGPU_STALL_STREAM_AFTER", "100"),
        ("SIMGPU_STATS_FILE", "/tmp/stats"),
        ("SIMGPU_TRACE_FILE", "/tmp/trace"),
    ])
    .expect("valid variables");
    assert_eq!(cfg.devices.len(), 3);
    for (i, d) in cfg.devices.iter().enumerate() {
        assert_eq!(d.name, "Simulated H100");
        assert_eq!(d.memory, 80 << 30);
        assert_eq!(d.sm_count, 132);
        assert_eq!(d.compute_capability, (9, 0));
        assert_eq!(d.uuid, DeviceConfig::a100(i as u32).uuid);
    }
    assert_eq!(cfg.driver_version, 12040);
    assert_eq!(cfg.state_dir, PathBuf::from("/tmp/simgpu-x"));
    assert_eq!(cfg.log_level, 2);
    assert_eq!(cfg.cost.kernel_base_ns, 3_000);
    assert_eq!(cfg.cost.wave_ns, 1_500_000);
    assert_eq!(
        cfg.cost.kernel_overrides,
        vec![
            ("gemm".to_owned(), 1_000_000),
            ("_Z6kernelPf".to_owned(), 250_000)
        ]
    );
    assert_eq!(cfg.cost.pcie_bytes_per_s, 12 << 30);
    assert_eq!(cfg.cost.hbm_bytes_per_s, 3_000_000_000_000);
    assert_eq!(cfg.faults.fail_alloc_nth, Some(3));
    assert_eq!(cfg.faults.launch_error, Some((5, 719)));
    assert_eq!(cfg.faults.stall_stream_after, Some(100));
}

#[test]
fn per_device_memory() {
    let cfg = load(&[
        ("SIMGPU_DEVICES", "3"),
        ("SIMGPU_MEMORY", "0:40GiB, 2:16GiB"),
    ])
    .expect("per-device memory");
    let memory: Vec<u64> = cfg.devices.iter().map(|d| d.memory).collect();
    assert_eq!(memory, vec![40 << 30, 40 << 30, 16 << 30]);

    let e = error(&[
        ("SIMGPU_DEVICES", "2"),
        ("SIMGPU_MEMORY", "0:40GiB,2:16GiB"),
    ]);
    assert!(
        e.starts_with("simgpu: invalid SIMGPU_MEMORY=\"0:40GiB,2:16GiB\": expected"),
        "{e}"
    );
    assert!(e.contains("device indexes 0 to 1"), "{e}");
    let e = error(&[("SIMGPU_MEMORY", "0:banana")]);
    assert!(e.contains("0:40GiB,1:16GiB"), "{e}");
    error(&[("SIMGPU_MEMORY", "x:1GiB")]);
    error(&[("SIMGPU_MEMORY", "0:0")]);
}

#[test]
fn device_count_truncates_and_extends() {
    let cfg = load(&[("SIMGPU_DEVICES", "16")]).expect("16 devices");
    assert_eq!(cfg.devices.len(), 16);
    assert_eq!(cfg.devices[15], DeviceConfig::a100(15));
    error(&[("SIMGPU_DEVICES", "0")]);
    error(&[("SIMGPU_DEVICES", "17")]);
}

#[test]
fn errors_name_the_variable_and_what_is_accepted() {
    let e = error(&[("SIMGPU_MEMORY", "banana")]);
    assert!(
        e.starts_with(
            "simgpu: invalid SIMGPU_MEMORY=\"banana\": expected a size like 40GiB or 512MiB"
        ),
        "{e}"
    );
    let cases: &[(&str, &str, &str)] = &[
        ("SIMGPU_DEVICES", "two", "device count from 1 to 16"),
        ("SIMGPU_MEMORY", "0", "greater than 0"),
        ("SIMGPU_MEMORY", "2TiB", "at most 1TiB"),
        ("SIMGPU_SMS", "0", "from 1 to 1024"),
        ("SIMGPU_SMS", "1025", "from 1 to 1024"),
        ("SIMGPU_CC", "21.0", "major 1 to 20"),
        ("SIMGPU_DRIVER_VERSION", "11080", "at least 12000"),
        ("SIMGPU_DRIVER_VERSION", "13.5", "like 13050"),
        ("SIMGPU_STATE_DIR", "relative/dir", "absolute"),
        ("SIMGPU_LOG", "verbose", "off, warn or debug"),
        ("SIMGPU_KERNEL_BASE", "5", "like 5us"),
        ("SIMGPU_WAVE", "2h", "like 5us"),
        ("SIMGPU_WAVE", "3601s", "at most 1 hour"),
        ("SIMGPU_KERNEL_TIME", "gemm", "name=duration"),
        ("SIMGPU_KERNEL_TIME", "=1ms", "name=duration"),
        ("SIMGPU_KERNEL_TIME", "gemm=2h", "name=duration"),
        ("SIMGPU_PCIE_BW", "0GB/s", "greater than 0"),
        ("SIMGPU_HBM_BW", "1500GB", "like 25GB/s"),
        ("SIMGPU_FAIL_ALLOC_NTH", "0", "positive integer"),
        ("SIMGPU_LAUNCH_ERROR", "5", "N:code"),
        ("SIMGPU_STALL_STREAM_AFTER", "-1", "number of operations"),
        ("SIMGPU_DEVICE_NAME", &"x".repeat(256), "1 to 255 bytes"),
    ];
    for (name, value, accepted) in cases {
        let e = error(&[(name, value)]);
        let prefix = format!("simgpu: invalid {name}={value:?}: expected ");
        assert!(e.starts_with(&prefix), "{e}");
        assert!(e.contains(accepted), "{e} should say {accepted}");
    }
}

#[test]
fn unknown_variable() {
    let e = error(&[("SIMGPU_MEMROY", "40GiB"), ("SIMGPU_ZZZ", "1")]);
    assert!(
        e.starts_with("simgpu: unknown variable SIMGPU_MEMROY; known: SIMGPU_CONFIG, "),
        "{e}"
    );
    assert!(e.contains("SIMGPU_MEMORY"), "{e}");
    // Variables of other programs pass.
    load(&[("CUDA_VISIBLE_DEVICES", "0"), ("SIMGPU", "1")]).expect("not ours");
}

const FULL_FILE: &str = r#"
driver_version = 12080
state_dir = "/dev/shm/simgpu-test"
log = "warn"

[[device]]
name = "Simulated A100-SXM4-80GB"
memory = "80GiB"
sms = 108
compute_capability = "8.0"
uuid = "GPU-01234567-89ab-cdef-0123-456789abcdef"
pci_bus = 32

[[device]]
memory = 17179869184
compute_capability = 8.6

[cost]
kernel_base = "4us"
wave = "10us"
pcie_bandwidth = "25GB/s"
hbm_bandwidth = "1500GB/s"
copy_base = "2us"
fault = "20us"
fault_bandwidth = "10GB/s"
prefetch_bandwidth = "18GB/s"

[cost.kernels]
"zz_gemm" = "2ms"
"_Z6kernelPf" = "1ms"
"gemm" = "3ms"

[faults]
fail_alloc_nth = 3
launch_error = "5:719"
stall_stream_after = 100
"#;

#[test]
fn toml_file_round_trip() {
    let file = toml_file(FULL_FILE);
    let cfg = load(&[("SIMGPU_CONFIG", &path_of(&file))]).expect("valid file");
    assert_eq!(cfg.driver_version, 12080);
    assert_eq!(cfg.state_dir, PathBuf::from("/dev/shm/simgpu-test"));
    assert_eq!(cfg.log_level, 1);
    assert_eq!(cfg.devices.len(), 2);
    let d0 = &cfg.devices[0];
    assert_eq!(d0.name, "Simulated A100-SXM4-80GB");
    assert_eq!(d0.memory, 80 << 30);
    assert_eq!(d0.sm_count, 108);
    assert_eq!(
        format_uuid(&d0.uuid),
        "GPU-01234567-89ab-cdef-0123-456789abcdef"
    );
    assert_eq!(d0.pci_bus, 32);
    let d1 = &cfg.devices[1];
    assert_eq!(d1.name, DeviceConfig::a100(1).name);
    assert_eq!(d1.memory, 16 << 30);
    assert_eq!(d1.compute_capability, (8, 6));
    assert_eq!(d1.uuid, DeviceConfig::a100(1).uuid);
    assert_eq!(d1.pci_bus, DeviceConfig::a100(1).pci_bus);
    let cost = &cfg.cost;
    assert_eq!(cost.kernel_base_ns, 4_000);
    assert_eq!(cost.wave_ns, 10_000);
    assert_eq!(cost.pcie_bytes_per_s, 25_000_000_000);
    assert_eq!(cost.hbm_bytes_per_s, 1_500_000_000_000);
    assert_eq!(cost.copy_base_ns, 2_000);
    assert_eq!(cost.fault_ns, 20_000);
    assert_eq!(cost.fault_bytes_per_s, 10_000_000_000);
    assert_eq!(cost.prefetch_bytes_per_s, Some(18_000_000_000));
    // Document order is kept, so the first substring match is the first in the file.
    let names: Vec<&str> = cost
        .kernel_overrides
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(names, ["zz_gemm", "_Z6kernelPf", "gemm"]);
    assert_eq!(cfg.faults.fail_alloc_nth, Some(3));
    assert_eq!(cfg.faults.launch_error, Some((5, 719)));
    assert_eq!(cfg.faults.stall_stream_after, Some(100));
}

#[test]
fn kernel_override_exact_then_first_substring() {
    let file = toml_file(FULL_FILE);
    let cfg = load(&[("SIMGPU_CONFIG", &path_of(&file))]).expect("valid file");
    assert_eq!(cfg.kernel_override("_Z6kernelPf"), Some(1_000_000));
    assert_eq!(cfg.kernel_override("gemm"), Some(3_000_000)); // exact beats zz_gemm
    assert_eq!(cfg.kernel_override("_Z7zz_gemm_v2Pf"), Some(2_000_000));
    assert_eq!(cfg.kernel_override("_Z9sgemm_128v"), Some(3_000_000));
    assert_eq!(cfg.kernel_override("_Z6reducePf"), None);
    assert_eq!(SimConfig::default().kernel_override("anything"), None);
}

#[test]
fn env_beats_file() {
    let file = toml_file(FULL_FILE);
    let cfg = load(&[
        ("SIMGPU_CONFIG", &path_of(&file)),
        ("SIMGPU_DEVICES", "4"),
        ("SIMGPU_MEMORY", "1:8GiB"),
        ("SIMGPU_DRIVER_VERSION", "13050"),
        ("SIMGPU_LOG", "off"),
        ("SIMGPU_KERNEL_BASE", "1us"),
        ("SIMGPU_KERNEL_TIME", "gemm=5ms,reduce=1us"),
        ("SIMGPU_LAUNCH_ERROR", "1:999"),
    ])
    .expect("valid");
    assert_eq!(cfg.devices.len(), 4);
    assert_eq!(cfg.devices[0].name, "Simulated A100-SXM4-80GB"); // from the file
    assert_eq!(cfg.devices[0].memory, 80 << 30);
    assert_eq!(cfg.devices[1].memory, 8 << 30);
    assert_eq!(cfg.devices[3], DeviceConfig::a100(3));
    assert_eq!(cfg.driver_version, 13050);
    assert_eq!(cfg.log_level, 0);
    assert_eq!(cfg.cost.kernel_base_ns, 1_000);
    assert_eq!(cfg.cost.wave_ns, 10_000); // from the file
    assert_eq!(cfg.kernel_override("gemm"), Some(5_000_000));
    assert_eq!(cfg.kernel_override("_Z6reducePf"), Some(1_000));
    assert_eq!(cfg.cost.kernel_overrides.len(), 4);
    assert_eq!(cfg.faults.launch_error, Some((1, 999)));
    assert_eq!(cfg.faults.fail_alloc_nth, Some(3)); // from the file

    let cfg = load(&[("SIMGPU_CONFIG", &path_of(&file)), ("SIMGPU_DEVICES", "1")]).expect("valid");
    assert_eq!(cfg.devices.len(), 1);
}

fn file_error(text: &str) -> (String, String) {
    let file = toml_file(text);
    let path = path_of(&file);
    (error(&[("SIMGPU_CONFIG", &path)]), path)
}

#[test]
fn unknown_toml_keys() {
    let (e, path) = file_error("driver_verison = 13050\n");
    assert!(
        e.starts_with(&format!(
            "simgpu: unknown key {path}:driver_verison; known: driver_version"
        )),
        "{e}"
    );
    let (e, path) = file_error("[[device]]\nmemroy = \"1GiB\"\n");
    assert!(
        e.starts_with(&format!(
            "simgpu: unknown key {path}:device[0].memroy; known: name"
        )),
        "{e}"
    );
    let (e, path) = file_error("[cost]\nwaves = \"1us\"\n");
    assert!(
        e.starts_with(&format!("simgpu: unknown key {path}:cost.waves;")),
        "{e}"
    );
    let (e, path) = file_error("[faults]\nfail_alloc = 1\n");
    assert!(
        e.starts_with(&format!("simgpu: unknown key {path}:faults.fail_alloc;")),
        "{e}"
    );
}

#[test]
fn toml_value_errors_name_file_and_key() {
    let (e, path) = file_error("[[device]]\n[[device]]\nmemory = \"banana\"\n");
    let prefix = format!(
        "simgpu: invalid {path}:device[1].memory=\"banana\": expected a size like 40GiB or 512MiB"
    );
    assert!(e.starts_with(&prefix), "{e}");
    let (e, path) = file_error("[cost]\nwave = 10\n");
    assert!(
        e.starts_with(&format!(
            "simgpu: invalid {path}:cost.wave=10: expected a duration"
        )),
        "{e}"
    );
    let (e, path) = file_error("[cost.kernels]\ngemm = \"fast\"\n");
    assert!(
        e.starts_with(&format!(
            "simgpu: invalid {path}:cost.kernels.\"gemm\"=\"fast\":"
        )),
        "{e}"
    );
    let (e, path) = file_error("log = true\n");
    assert!(
        e.starts_with(&format!(
            "simgpu: invalid {path}:log=a boolean: expected off"
        )),
        "{e}"
    );
    let (e, path) = file_error("cost = 5\n");
    assert!(
        e.starts_with(&format!(
            "simgpu: invalid {path}:cost=5: expected a table ([cost])"
        )),
        "{e}"
    );
    let (e, _) = file_error("[device]\nname = \"x\"\n");
    assert!(
        e.contains(":device=a table: expected 1 to 16 [[device]] tables"),
        "{e}"
    );
    let (e, _) = file_error("device = []\n");
    assert!(e.contains(":device=an array: expected 1 to 16"), "{e}");
    let (e, _) = file_error(&"[[device]]\n".repeat(17));
    assert!(e.contains("expected 1 to 16"), "{e}");
    let (e, _) = file_error("state_dir = 1979-05-27\n");
    assert!(
        e.contains(":state_dir=a date-time: expected an absolute"),
        "{e}"
    );
    let uuid = "uuid = \"GPU-01234567-89ab-cdef-0123-456789abcdef\"\n";
    let (e, _) = file_error(&format!("[[device]]\n{uuid}[[device]]\n{uuid}"));
    assert!(e.contains(":device[1].uuid=\"GPU-"), "{e}");
    assert!(e.contains("different from device[0]"), "{e}");
}

#[test]
fn unreadable_or_invalid_file() {
    let e = error(&[("SIMGPU_CONFIG", "/nonexistent/simgpu.toml")]);
    assert!(
        e.starts_with(
            "simgpu: invalid SIMGPU_CONFIG=\"/nonexistent/simgpu.toml\": cannot read the file:"
        ),
        "{e}"
    );
    let (e, path) = file_error("log = \"warn\"\n[cost\nwave = 1\n");
    let prefix = format!("simgpu: invalid SIMGPU_CONFIG={path:?}: TOML error at line 2, column ");
    assert!(e.starts_with(&prefix), "{e}");
    let (e, _) = file_error("log = \"warn\"\nlog = \"off\"\n");
    assert!(e.contains("TOML error at line 2"), "{e}");
}

#[test]
fn file_errors_are_reported_even_if_env_overrides_the_key() {
    let file = toml_file("log = \"loud\"\n");
    let e = error(&[("SIMGPU_CONFIG", &path_of(&file)), ("SIMGPU_LOG", "off")]);
    assert!(
        e.contains(":log=\"loud\": expected off, warn or debug"),
        "{e}"
    );
}

#[test]
fn the_table_names_each_variable_and_key_once_in_the_documented_order() {
    // What `unknown variable`/`unknown key` errors list, as before the table.
    assert_eq!(
        known_vars(),
        [
            "SIMGPU_CONFIG",
            "SIMGPU_DEVICES",
            "SIMGPU_DEVICE_NAME",
            "SIMGPU_MEMORY",
            "SIMGPU_SMS",
            "SIMGPU_CC",
            "SIMGPU_DRIVER_VERSION",
            "SIMGPU_STATE_DIR",
            "SIMGPU_LOG",
            "SIMGPU_KERNEL_BASE",
            "SIMGPU_WAVE",
            "SIMGPU_KERNEL_TIME",
            "SIMGPU_PCIE_BW",
            "SIMGPU_HBM_BW",
            "SIMGPU_FAULT_BW",
            "SIMGPU_PREFETCH_BW",
            "SIMGPU_TIMESLICE",
            "SIMGPU_CTX_SWITCH",
            "SIMGPU_KERNEL_TRACE",
            "SIMGPU_FAIL_ALLOC_NTH",
            "SIMGPU_LAUNCH_ERROR",
            "SIMGPU_STALL_STREAM_AFTER",
            "SIMGPU_STATS_FILE",
            "SIMGPU_TRACE_FILE",
        ]
    );
    assert_eq!(
        known_keys(""),
        [
            "driver_version",
            "state_dir",
            "log",
            "device",
            "cost",
            "faults"
        ]
    );
    assert_eq!(
        known_keys("device"),
        [
            "name",
            "memory",
            "sms",
            "compute_capability",
            "uuid",
            "pci_domain",
            "pci_bus",
            "pci_device"
        ]
    );
    assert_eq!(
        known_keys("cost"),
        [
            "kernel_base",
            "wave",
            "pcie_bandwidth",
            "hbm_bandwidth",
            "copy_base",
            "fault",
            "fault_bandwidth",
            "prefetch_bandwidth",
            "timeslice",
            "ctx_switch",
            "kernels"
        ]
    );
    assert_eq!(
        known_keys("faults"),
        ["fail_alloc_nth", "launch_error", "stall_stream_after"]
    );
    let vars = known_vars();
    let unique: std::collections::BTreeSet<_> = vars.iter().collect();
    assert_eq!(unique.len(), vars.len(), "a variable in two rows");
}
