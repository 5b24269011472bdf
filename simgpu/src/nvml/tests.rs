use super::*;
use crate::shared::BUCKET_NS;
use std::ptr::{null, null_mut};

#[test]
fn uuid_and_bus_ids() {
    let d = DeviceConfig::a100(0);
    assert_eq!(
        format_uuid(&d.uuid),
        "GPU-73696d67-7075-2d64-6576-6963652d0000"
    );
    assert_eq!(bus_id(&d), "00000000:10:00.0");
    assert_eq!(bus_id_legacy(&d), "0000:10:00.0");
    let mut d = DeviceConfig::a100(3);
    d.pci_domain = 0xab;
    d.pci_device = 0x1f;
    assert_eq!(bus_id(&d), "000000AB:13:1F.0");
    assert_eq!(bus_id_legacy(&d), "00AB:13:1F.0");
    let legacy: [c_char; 16] = fill_c(&bus_id_legacy(&d));
    assert_eq!(legacy[12], 0);
}

#[test]
fn bus_id_formats_accepted() {
    assert_eq!(parse_bus_id("00000000:10:00.0"), Some((0, 0x10, 0, 0)));
    assert_eq!(parse_bus_id("0000:10:00.0"), Some((0, 0x10, 0, 0)));
    assert_eq!(parse_bus_id("0:1a:1f"), Some((0, 0x1a, 0x1f, 0)));
    assert_eq!(parse_bus_id("10:00.1"), Some((0, 0x10, 0, 1)));
    assert_eq!(
        parse_bus_id("000000AB:13:1F.0"),
        Some((0xab, 0x13, 0x1f, 0))
    );
    for bad in [
        "",
        "10",
        "10:00",
        "x:10:00.0",
        "0:0:0:0",
        "0:10:.0",
        "123456789:0:0.0",
    ] {
        assert_eq!(parse_bus_id(bad), None, "{bad}");
    }
}

#[test]
fn version_strings() {
    assert_eq!(driver_version_string(13000), "580.00");
    assert_eq!(driver_version_string(13050), "605.00");
    assert_eq!(driver_version_string(12020), "535.00");
    assert_eq!(driver_version_string(12090), "575.00");
}

/// `out_list` on a test's own locals.
fn list(items: &[NvmlProcessInfoV1], count: *mut c_uint, out: *mut NvmlProcessInfoV1) -> R {
    // SAFETY: the tests pass NULL or pointers to their live locals; `out` has room for the
    // `*count` entries passed in.
    unsafe { out_list(items, count, out) }
}

/// `out_str` on a test's own buffer.
fn string(buf: *mut c_char, len: c_uint, s: &str) -> R {
    // SAFETY: the tests pass NULL or their live buffer of at least `len` bytes.
    unsafe { out_str(buf, len, s) }
}

#[test]
fn list_size_protocol() {
    let items = [info_v1(1, 10), info_v1(2, 20)];
    let mut count = 0;
    assert_eq!(
        list(&items, &mut count, null_mut()),
        Err(NVML_ERROR_INSUFFICIENT_SIZE)
    );
    assert_eq!(count, 2);
    let mut buf = [NvmlProcessInfoV1::default(); 1];
    count = 1;
    assert_eq!(
        list(&items, &mut count, buf.as_mut_ptr()),
        Err(NVML_ERROR_INSUFFICIENT_SIZE)
    );
    assert_eq!(count, 2);
    let mut buf = [NvmlProcessInfoV1::default(); 5];
    count = 5;
    assert_eq!(list(&items, &mut count, buf.as_mut_ptr()), Ok(()));
    assert_eq!((count, &buf[..2]), (2, &items[..]));
    count = 5;
    assert_eq!(
        list(&items, &mut count, null_mut()),
        Err(NVML_ERROR_INVALID_ARGUMENT)
    );
    count = 0;
    assert_eq!(list(&[], &mut count, null_mut()), Ok(()));
    assert_eq!(count, 0);
    assert_eq!(
        list(&items, null_mut(), buf.as_mut_ptr()),
        Err(NVML_ERROR_INVALID_ARGUMENT)
    );
}

#[test]
fn strings_need_room_for_the_nul() {
    let mut buf = [1 as c_char; 8];
    assert_eq!(
        string(buf.as_mut_ptr(), 4, "abcd"),
        Err(NVML_ERROR_INSUFFICIENT_SIZE)
    );
    assert_eq!(string(buf.as_mut_ptr(), 5, "abcd"), Ok(()));
    assert_eq!(buf[..6], [97, 98, 99, 100, 0, 1]);
    assert_eq!(
        string(null_mut(), 5, "abcd"),
        Err(NVML_ERROR_INVALID_ARGUMENT)
    );
}

/// A child process that lives until dropped: a second live pid for the process tables.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn processes_and_samples_from_shared_state() {
    let dir = tempfile::tempdir().unwrap();
    let sh = Shared::open(dir.path(), &[1 << 30, 1 << 30]).unwrap();
    let child = Child(
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap(),
    );
    let me = std::process::id();
    let (a, _) = sh.register(me).unwrap();
    let (b, _) = sh.register(child.0.id()).unwrap();
    let (idle, _) = sh.register(child.0.id()).unwrap(); // a slot with nothing on any device
    let dead = (0..crate::shared::MAX_PROCS)
        .find(|i| ![a, b, idle].contains(i))
        .unwrap();
    sh.id(dead).pid.store(u32::MAX - 7, Release); // no such process
    sh.slot(dead).dev[0].mem_used.store(1 << 20, Release);

    sh.slot(a).dev[0].mem_used.store(64 << 20, Release);
    sh.slot(b).dev[0].kernels.store(3, Release); // kernels only, no memory
    sh.slot(b).dev[1].mem_used.store(4096, Release);
    let now = 1000 * BUCKET_NS;
    sh.slot(a).dev[0]
        .window
        .add(now - 500_000_000, now - 250_000_000); // 25 %
    sh.slot(b).dev[0].window.add(now - 100_000_000, now); // 10 %

    let p0 = running_processes(&sh, 0);
    assert_eq!(p0, vec![(a, me, 64 << 20), (b, child.0.id(), 0)]);
    let p1 = running_processes(&sh, 1);
    assert_eq!(p1, vec![(b, child.0.id(), 4096)]);

    let s0 = process_samples(&sh, 0, now, 77);
    assert_eq!(s0.len(), 2);
    assert_eq!((s0[0].pid, s0[0].time_stamp, s0[0].sm_util), (me, 77, 25));
    assert_eq!((s0[1].pid, s0[1].sm_util), (child.0.id(), 10));
    assert_eq!(process_samples(&sh, 1, now, 77)[0].sm_util, 0);

    // Once the child is gone it is no longer listed.
    drop(child);
    assert_eq!(running_processes(&sh, 0), vec![(a, me, 64 << 20)]);
    assert!(running_processes(&sh, 1).is_empty());
}

/// The exports end to end on a temporary machine (the only test that initialises NVML:
/// the state is per process).
#[test]
fn exports_end_to_end() {
    // SAFETY: every pointer passed below is to a live local of the type NVML documents (or a
    // deliberate NULL, which the exports reject).
    unsafe {
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);

        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SimConfig {
            state_dir: dir.path().to_path_buf(),
            devices: vec![DeviceConfig::a100(0), DeviceConfig::a100(1)],
            ..SimConfig::default()
        };
        cfg.devices[1].memory = 8 << 30;
        assert_eq!(init_with(|| Ok(cfg)), NVML_SUCCESS);
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS); // refcounted; config already loaded

        assert_eq!(
            nvmlDeviceGetCount_v2(null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(nvmlDeviceGetCount(&mut count), NVML_SUCCESS);
        assert_eq!(count, 2);
        let mut h = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(2, &mut h),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut h), NVML_SUCCESS);
        let mut index = 9;
        assert_eq!(nvmlDeviceGetIndex(h, &mut index), NVML_SUCCESS);
        assert_eq!(index, 1);
        let mut x = 0u8;
        let bogus = &mut x as *mut u8 as NvmlDevice;
        assert_eq!(
            nvmlDeviceGetIndex(bogus, &mut index),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetIndex(null_mut(), &mut index),
            NVML_ERROR_INVALID_ARGUMENT
        );

        let mut buf = [0 as c_char; 96];
        assert_eq!(nvmlDeviceGetUUID(h, buf.as_mut_ptr(), 96), NVML_SUCCESS);
        let uuid = CStr::from_ptr(buf.as_ptr()).to_owned();
        assert_eq!(
            uuid.to_str().unwrap(),
            format_uuid(&DeviceConfig::a100(1).uuid)
        );
        assert_eq!(
            nvmlDeviceGetUUID(h, buf.as_mut_ptr(), 40),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        let mut h2 = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut h2),
            NVML_SUCCESS
        );
        assert_eq!(h2, h);
        assert_eq!(
            nvmlDeviceGetHandleByUUID(
                c"GPU-00000000-0000-0000-0000-000000000000".as_ptr(),
                &mut h2
            ),
            NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetHandleByUUID(null(), &mut h2),
            NVML_ERROR_INVALID_ARGUMENT
        );
        h2 = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:11:00.0".as_ptr(), &mut h2),
            NVML_SUCCESS
        );
        assert_eq!(h2, h);
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:42:00.0".as_ptr(), &mut h2),
            NVML_ERROR_NOT_FOUND
        );

        let mut pci: NvmlPciInfo = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(h, &mut pci), NVML_SUCCESS);
        assert_eq!(
            CStr::from_ptr(pci.bus_id.as_ptr()).to_str().unwrap(),
            "00000000:11:00.0"
        );
        assert_eq!(
            CStr::from_ptr(pci.bus_id_legacy.as_ptr()).to_str().unwrap(),
            "0000:11:00.0"
        );
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x11, 0));
        let mut old: NvmlPciInfoV2 = std::mem::zeroed();
        old.reserved = [7; 4];
        assert_eq!(nvmlDeviceGetPciInfo(h, &mut old), NVML_SUCCESS);
        assert_eq!(
            (old.bus, old.pci_device_id, old.reserved),
            (0x11, PCI_DEVICE_ID, [7; 4])
        );

        let mut mem = NvmlMemory::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(h, &mut mem), NVML_SUCCESS);
        assert_eq!(
            mem,
            NvmlMemory {
                total: 8 << 30,
                free: 8 << 30,
                used: 0
            }
        );
        let mut mem2 = NvmlMemoryV2::default();
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(h, &mut mem2),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        mem2.version = NVML_MEMORY_V2;
        mem2.reserved = 5;
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(h, &mut mem2), NVML_SUCCESS);
        assert_eq!((mem2.total, mem2.reserved, mem2.used), (8 << 30, 0, 0));

        let mut util = NvmlUtilization { gpu: 9, memory: 9 };
        assert_eq!(nvmlDeviceGetUtilizationRates(h, &mut util), NVML_SUCCESS);
        assert_eq!(util, NvmlUtilization::default());

        let mut n = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h, &mut n, null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(n, 0);
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, null_mut(), &mut n, 0),
            NVML_ERROR_NOT_FOUND
        );

        // A process using device 1 shows up in the lists and the memory total.
        let st = state().unwrap();
        let (slot, _) = st.shared.register(std::process::id()).unwrap();
        let pd = &st.shared.slot(slot).dev[1];
        pd.mem_used.store(64 << 20, Release);
        st.shared.dev(1).mem_used.store(64 << 20, Release);
        let t = now_ns();
        pd.window.add(t - 300_000_000, t);
        st.shared.dev(1).window.add(t - 300_000_000, t);
        assert_eq!(nvmlDeviceGetMemoryInfo(h, &mut mem), NVML_SUCCESS);
        assert_eq!((mem.used, mem.free), (64 << 20, (8 << 30) - (64 << 20)));
        assert_eq!(nvmlDeviceGetUtilizationRates(h, &mut util), NVML_SUCCESS);
        assert!((25..=35).contains(&util.gpu), "{util:?}");

        n = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h, &mut n, null_mut()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(n, 1);
        let mut procs = [NvmlProcessInfoV2::default(); 4];
        n = 4;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v2(h, &mut n, procs.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!((n, procs[0]), (1, info_v2(std::process::id(), 64 << 20)));
        let mut procs1 = [NvmlProcessInfoV1::default(); 1];
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses(h, &mut n, procs1.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(procs1[0], info_v1(std::process::id(), 64 << 20));
        n = 4;
        assert_eq!(
            nvmlDeviceGetGraphicsRunningProcesses_v3(h, &mut n, procs.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(n, 0);

        n = 0;
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, null_mut(), &mut n, 0),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(n, 1);
        let mut samples = [NvmlProcessUtilizationSample::default(); 1];
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, samples.as_mut_ptr(), &mut n, 0),
            NVML_SUCCESS
        );
        assert_eq!(samples[0].pid, std::process::id());
        assert!((25..=35).contains(&samples[0].sm_util), "{:?}", samples[0]);
        assert!(samples[0].time_stamp > 0);
        assert_eq!(
            nvmlDeviceGetProcessUtilization(h, samples.as_mut_ptr(), &mut n, u64::MAX),
            NVML_ERROR_NOT_FOUND
        );
        st.shared.release_slot(slot, std::process::id());

        let (mut major, mut minor) = (0, 0);
        assert_eq!(
            nvmlDeviceGetCudaComputeCapability(h, &mut major, &mut minor),
            NVML_SUCCESS
        );
        assert_eq!((major, minor), (8, 0));
        let mut v = 0;
        assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut v), NVML_SUCCESS);
        assert_eq!(v, SimConfig::default().driver_version);
        assert_eq!(
            nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80),
            NVML_SUCCESS
        );
        let mut temp = 0;
        assert_eq!(nvmlDeviceGetTemperature(h, 0, &mut temp), NVML_SUCCESS);
        assert_eq!(
            nvmlDeviceGetTemperature(h, 1, &mut temp),
            NVML_ERROR_INVALID_ARGUMENT
        );
        let mut mhz = 0;
        assert_eq!(nvmlDeviceGetClockInfo(h, 1, &mut mhz), NVML_SUCCESS);
        assert_eq!(mhz, 1410);
        assert_eq!(nvmlDeviceGetMaxClockInfo(h, 2, &mut mhz), NVML_SUCCESS);
        assert_eq!(mhz, 1215);
        assert_eq!(
            nvmlDeviceGetClockInfo(h, 4, &mut mhz),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            CStr::from_ptr(nvmlErrorString(7)).to_str().unwrap(),
            "Insufficient Size"
        );

        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount(&mut count), NVML_SUCCESS); // one init still open
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount(&mut count), NVML_ERROR_UNINITIALIZED);
        assert_eq!(
            nvmlDeviceGetMemoryInfo(h, &mut mem),
            NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    }
}
