use super::*;

const K_CUBIN_SM80: &[u8] = include_bytes!("../tests/fixtures/k_sm80.cubin");
const K_CUBIN_SM100: &[u8] = include_bytes!("../tests/fixtures/k_sm100.cubin");
const K_PTX: &[u8] = include_bytes!("../tests/fixtures/k.ptx");
const K_FATBIN: &[u8] = include_bytes!("../tests/fixtures/k.fatbin");
const K_FATBIN_ZSTD: &[u8] = include_bytes!("../tests/fixtures/k_zstd.fatbin");
const K_FATBIN_LZ4: &[u8] = include_bytes!("../tests/fixtures/k_lz4.fatbin");
const K_FATBIN_NONE: &[u8] = include_bytes!("../tests/fixtures/k_none.fatbin");
const K_FATBIN_CONCAT: &[u8] = include_bytes!("../tests/fixtures/k_concat.fatbin");
const RDC_CUBIN: &[u8] = include_bytes!("../tests/fixtures/rdc_sm80.cubin");
const ALIGN_FATBIN: &[u8] = include_bytes!("../tests/fixtures/align.fatbin");

fn p(offset: u32, size: u32) -> ParamInfo {
    ParamInfo { offset, size }
}

/// Checks what every image built from k.cu must contain. `with_init`: the image has
/// initial bytes of `init` and `cst`.
fn check_k(info: &ImageInfo, with_init: bool) {
    // `kanon` has internal linkage: its mangled name carries a per-file hash.
    let anon = info
        .kernels
        .iter()
        .find(|k| k.name.ends_with("5kanonEs"))
        .map(|k| k.name.as_str())
        .expect("kanon");
    let mut names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
    names.sort_unstable();
    let mut want = vec!["_Z5kgrid3S24Pi", "kmix", "knoparam", "kptr", anon];
    want.sort_unstable();
    assert_eq!(names, want);
    let params = |n: &str| info.kernel(n).and_then(|k| k.params.clone());
    assert_eq!(params(anon), Some(vec![p(0, 2)]));
    assert_eq!(params("kptr"), Some(vec![p(0, 8)]));
    assert_eq!(
        params("kmix"),
        Some(vec![
            p(0, 8),
            p(8, 4),
            p(12, 4),
            p(16, 24),
            p(40, 1),
            p(48, 8)
        ])
    );
    assert_eq!(params("_Z5kgrid3S24Pi"), Some(vec![p(0, 24), p(24, 8)]));
    assert_eq!(params("knoparam"), Some(vec![]));
    assert_eq!(info.kernel("kmix").and_then(|k| k.params_size()), Some(56));

    let g = info.global("g").expect("g");
    assert_eq!((g.size, &g.init), (64, &None));
    let init = info.global("init").expect("init");
    assert_eq!(init.size, 4);
    let cst = info.global("cst").expect("cst");
    assert_eq!(cst.size, 16);
    if with_init {
        assert_eq!(init.init.as_deref(), Some(&7i32.to_le_bytes()[..]));
        let want: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(cst.init.as_deref(), Some(&want[..]));
    }
    // The device function `helper` is not a kernel.
    assert!(info.kernels.iter().all(|k| !k.name.contains("helper")));
}

#[test]
fn cubin_sm80() {
    let info = parse_bytes(K_CUBIN_SM80).expect("parse");
    check_k(&info, true);
    assert_eq!(info.globals.len(), 3);
}

#[test]
fn cubin_sm100_without_param_cbank() {
    check_k(&parse_bytes(K_CUBIN_SM100).expect("parse"), true);
}

#[test]
fn elf_length_matches_file() {
    for f in [K_CUBIN_SM80, K_CUBIN_SM100, RDC_CUBIN] {
        let len = elf_len(|off, len| slice(f, off, len, "t")).expect("len");
        assert_eq!(len, f.len() as u64);
    }
}

#[test]
fn ptx_text() {
    check_k(&parse_bytes(K_PTX).expect("parse"), true);
}

#[test]
fn fatbins_all_compressions() {
    for (name, f) in [
        ("default", K_FATBIN),
        ("zstd", K_FATBIN_ZSTD),
        ("lz4", K_FATBIN_LZ4),
        ("none", K_FATBIN_NONE),
        ("concat", K_FATBIN_CONCAT),
    ] {
        let info = parse_bytes(f).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_k(&info, true);
        assert_eq!(info.globals.len(), 3, "{name}");
    }
}

#[test]
fn concatenated_entries() {
    // k_concat.fatbin: one entry with the compute_90 and compute_100 PTX, one with the
    // sm_75 and sm_90 cubins; each must give the whole module on its own.
    let body = &K_FATBIN_CONCAT[16..];
    let mut off = 0;
    let mut kinds = Vec::new();
    while off < body.len() {
        let e = entry_header(body, off).expect("entry");
        let hs = e.header_size_or_offset as usize;
        let header = &body[off..off + hs];
        let payload = &body[off + hs..off + hs + e.payload_size as usize];
        let mut c = Collector::new(None);
        assert!(entry(&e, header, payload, &mut c).expect("entry parses"));
        check_k(&c.finish(), true);
        kinds.push(e.kind);
        off += hs + payload.len();
    }
    assert_eq!(kinds, [ENTRY_KIND_CONCAT, ENTRY_KIND_CONCAT]);
}

#[test]
fn param_layout_of_the_device_architecture() {
    let kal = |sm: Option<u32>| {
        let info = match sm {
            Some(sm) => parse_bytes_for_arch(ALIGN_FATBIN, sm),
            None => parse_bytes(ALIGN_FATBIN),
        };
        info.expect("parse")
            .kernel("kal")
            .and_then(|k| k.params.clone())
            .expect("kal params")
    };
    let at = |off: u32| vec![p(off, 256), p(off + 256, 8)];
    assert_eq!(kal(None), at(32)); // the first cubin (sm_75)
    assert_eq!(kal(Some(70)), at(32)); // none at or below: the lowest above
    assert_eq!(kal(Some(80)), at(32));
    assert_eq!(kal(Some(89)), at(32));
    assert_eq!(kal(Some(90)), at(112));
    assert_eq!(kal(Some(120)), at(0));
    // SAFETY: a complete fatbin.
    let info = unsafe { parse_image_for_arch(ALIGN_FATBIN.as_ptr(), 90) }.expect("parse");
    assert_eq!(
        info.kernel("kal").and_then(|k| k.params.clone()),
        Some(at(112))
    );
}

#[test]
fn default_fatbin_compresses_ptx_only() {
    let first = entry_header(K_FATBIN, 16).expect("entry");
    assert_eq!(first.kind, ENTRY_KIND_ELF);
    assert_eq!(first.flags & (ENTRY_FLAG_ZSTD | ENTRY_FLAG_LZ4), 0);
    let second = entry_header(K_FATBIN, 16 + 64 + first.payload_size as usize).expect("e");
    assert_eq!(second.kind, ENTRY_KIND_PTX);
    assert_ne!(second.flags & ENTRY_FLAG_ZSTD, 0);
}

#[test]
fn relocatable_cubin() {
    let info = parse_bytes(RDC_CUBIN).expect("parse");
    let names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["rk"]);
    assert_eq!(
        info.kernel("rk").and_then(|k| k.params.clone()),
        Some(vec![p(0, 8), p(8, 8)])
    );
    let pub_var = info.global("pub_var").expect("pub_var");
    let want: Vec<u8> = [1i32, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(pub_var.init.as_deref(), Some(&want[..]));
    assert_eq!(
        info.global("ug").map(|g| (g.size, g.init.is_none())),
        Some((20, true))
    );
    assert_eq!(info.global("man").map(|g| g.size), Some(4));
    assert_eq!(
        info.global("cc").and_then(|g| g.init.clone()),
        Some([5i32, 6].iter().flat_map(|v| v.to_le_bytes()).collect())
    );
    // Undefined (extern) variables are not defined here.
    assert!(info.global("ext_var").is_none());
}

#[test]
fn parse_image_all_formats() {
    // SAFETY: each pointer is to a complete image (PTX copied with a terminating NUL).
    unsafe {
        check_k(&parse_image(K_CUBIN_SM80.as_ptr()).expect("cubin"), true);
        check_k(&parse_image(K_FATBIN.as_ptr()).expect("fatbin"), true);
        let mut ptx = K_PTX.to_vec();
        ptx.push(0);
        check_k(&parse_image(ptx.as_ptr()).expect("ptx"), true);

        #[repr(C)]
        struct Wrapper {
            magic: u32,
            version: u32,
            data: *const u8,
            filename: *const u8,
        }
        let w = Wrapper {
            magic: FATBIN_WRAPPER_MAGIC,
            version: 1,
            data: K_FATBIN_ZSTD.as_ptr(),
            filename: std::ptr::null(),
        };
        let info = parse_image(&w as *const Wrapper as *const u8).expect("wrapper");
        check_k(&info, true);
        let w0 = Wrapper {
            data: std::ptr::null(),
            ..w
        };
        assert!(matches!(
            parse_image(&w0 as *const Wrapper as *const u8),
            Err(ImageError::Null)
        ));
        assert!(matches!(
            parse_image(std::ptr::null()),
            Err(ImageError::Null)
        ));
        assert!(matches!(
            parse_image(c"".as_ptr().cast()),
            Err(ImageError::UnknownFormat(0))
        ));
        assert!(matches!(
            parse_image(c"ab".as_ptr().cast()),
            Err(ImageError::UnknownFormat(_))
        ));
    }
}

#[test]
fn wrapper_in_bytes_is_unsupported() {
    let mut w = FATBIN_WRAPPER_MAGIC.to_le_bytes().to_vec();
    w.extend_from_slice(&[1, 0, 0, 0]);
    w.extend_from_slice(&[0; 16]);
    assert!(matches!(parse_bytes(&w), Err(ImageError::Unsupported(_))));
}

#[test]
fn handwritten_ptx() {
    let ptx = b"
        /* block comment .entry fake( */
        .version 8.0
        .target sm_80 // comment
        .address_size 64
        .file 1 \"a//b.cu\"
        .extern .global .align 4 .b8 ext[];
        .global .u32 a = 5, b, c[2] = {-1, 0x10};
        .visible .global .align 8 .f64 dd[2] = {0d3FF0000000000000, 2};
        .global .f32 ff = 0f40000000;
        .global .align 1 .b8 bytes[] = {1, 2, 3};
        .global .u64 addr = generic(a);
        .const .align 4 .v2 .u32 vv[3];
        .visible .entry k1(
            .param .u64 .ptr .global .align 16 k1_p0,
            .param .b8 k1_p1,
            .param .align 16 .b8 k1_p2[32],
            .param .v2 .f32 k1_p3
        )
        .maxntid 128, 1, 1
        {
            .reg .b32 %r<2>;
            .global .u32 not_module_scope;
            ret;
        }
        .entry k2
        {
            ret;
        }
        .extern .entry k3(.param .u32 x);
    ";
    let info = parse_bytes(ptx).expect("parse");
    let names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["k1", "k2"]);
    assert_eq!(
        info.kernels[0].params,
        Some(vec![p(0, 8), p(8, 1), p(16, 32), p(48, 8)])
    );
    assert_eq!(info.kernels[1].params, Some(vec![]));
    let g = |n: &str| info.global(n).map(|g| (g.size, g.init.clone()));
    assert_eq!(g("a"), Some((4, Some(vec![5, 0, 0, 0]))));
    assert_eq!(g("b"), Some((4, None)));
    assert_eq!(
        g("c"),
        Some((8, Some(vec![0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0])))
    );
    let dd: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|f| f.to_le_bytes()).collect();
    assert_eq!(g("dd"), Some((16, Some(dd))));
    assert_eq!(g("ff"), Some((4, Some(2.0f32.to_le_bytes().to_vec()))));
    assert_eq!(g("bytes"), Some((3, Some(vec![1, 2, 3]))));
    assert_eq!(g("addr"), Some((8, None)));
    assert_eq!(g("vv"), Some((24, None)));
    assert!(info.global("ext").is_none());
    assert!(info.global("not_module_scope").is_none());
    assert_eq!(info.globals.len(), 8);
}

#[test]
fn not_an_image() {
    assert!(matches!(
        parse_bytes(b""),
        Err(ImageError::UnknownFormat(0))
    ));
    assert!(matches!(
        parse_bytes(b"hello world"),
        Err(ImageError::UnknownFormat(_))
    ));
    assert!(matches!(
        parse_bytes(b".target sm_80\n"),
        Err(ImageError::UnknownFormat(_))
    ));
    let mut elf32 = K_CUBIN_SM80.to_vec();
    elf32[4] = 1;
    assert!(matches!(
        parse_bytes(&elf32),
        Err(ImageError::Unsupported(_))
    ));
    let e = parse_bytes(b"garbage").err().map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some("module image is not a fatbin, cubin or PTX (first bytes 0x62726167)")
    );
}

#[test]
fn lz4_rejects_bad_offsets() {
    // Literal "ab", then a match at offset 3 (before the start).
    assert!(lz4_block_decompress(&[0x20, b'a', b'b', 3, 0], 100).is_err());
    // Literal "ab", match offset 2 length 4, then literal "c": "ababab" + "c".
    let out = lz4_block_decompress(&[0x20, b'a', b'b', 2, 0, 0x10, b'c'], 100);
    assert_eq!(out.ok().as_deref(), Some(&b"abababc"[..]));
    assert!(lz4_block_decompress(&[0x20, b'a', b'b', 2, 0, 0x10, b'c'], 5).is_err());
}

/// Deterministic xorshift for the fuzz tests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn all_fixtures() -> [&'static [u8]; 10] {
    [
        ALIGN_FATBIN,
        K_CUBIN_SM80,
        K_CUBIN_SM100,
        K_PTX,
        K_FATBIN,
        K_FATBIN_ZSTD,
        K_FATBIN_LZ4,
        K_FATBIN_NONE,
        K_FATBIN_CONCAT,
        RDC_CUBIN,
    ]
}

#[test]
fn fuzz_truncated() {
    for f in all_fixtures() {
        let step = (f.len() / 400).max(1);
        for len in (0..f.len()).step_by(step) {
            let r = parse_bytes(&f[..len]);
            // A truncated binary image must fail; a truncated PTX may still parse.
            if f != K_PTX {
                assert!(r.is_err(), "truncated to {len} parsed");
            }
        }
    }
}

#[test]
fn fuzz_bit_flips() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for f in all_fixtures() {
        let mut buf = f.to_vec();
        for _ in 0..600 {
            buf.copy_from_slice(f);
            let flips = 1 + rng.next() % 4;
            for _ in 0..flips {
                // Bias half of the flips to the headers, where they matter most.
                let range = if rng.next() & 1 == 0 {
                    buf.len().min(256)
                } else {
                    buf.len()
                };
                let pos = (rng.next() % range as u64) as usize;
                buf[pos] ^= 1 << (rng.next() % 8);
            }
            let _ = parse_bytes(&buf);
        }
    }
}

#[test]
fn fuzz_random_headers() {
    // Random values in the size fields of the first fatbin entry header and of the ELF header.
    let mut rng = Rng(12345);
    for _ in 0..2000 {
        let mut fat = K_FATBIN_ZSTD.to_vec();
        let field = [20usize, 24, 32, 36, 56, 72, 80, 88][(rng.next() % 8) as usize];
        let v = rng.next().to_le_bytes();
        let w = if rng.next() & 1 == 0 { 4 } else { 8 };
        fat[field..field + w].copy_from_slice(&v[..w]);
        let _ = parse_bytes(&fat);

        let mut elf = K_CUBIN_SM80.to_vec();
        let field = [0x20usize, 0x28, 0x36, 0x38, 0x3a, 0x3c, 0x3e][(rng.next() % 7) as usize];
        elf[field..field + 2].copy_from_slice(&v[..2]);
        let _ = parse_bytes(&elf);
    }
}

#[test]
fn the_ptx_a_fatbin_carries_is_read_whatever_its_compression() {
    // nvcc's fatbin keeps the PTX without comments and with less whitespace.
    let words = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    };
    let plain = words(std::str::from_utf8(K_PTX).unwrap().trim_end_matches('\0'));
    for fat in [K_FATBIN, K_FATBIN_ZSTD, K_FATBIN_LZ4, K_FATBIN_NONE] {
        let ptx = fatbin_ptx(fat).expect("fatbin_ptx");
        assert_eq!(ptx.len(), 1, "one PTX entry");
        assert_eq!(ptx[0].arch, 80);
        assert_eq!(words(&ptx[0].text), plain, "the text nvcc -ptx writes");
    }
    assert!(fatbin_ptx(K_CUBIN_SM80).is_err(), "a cubin is not a fatbin");
    let mut cut = K_FATBIN_ZSTD.to_vec();
    cut.truncate(cut.len() / 2);
    assert!(fatbin_ptx(&cut).is_err());
}

#[test]
fn host_fatbins_reads_nothing_from_an_elf_without_the_section_and_rejects_other_files() {
    assert_eq!(
        host_fatbins(K_CUBIN_SM80).expect("an ELF"),
        Vec::<&[u8]>::new()
    );
    assert!(host_fatbins(K_PTX).is_err());
    assert!(host_fatbins(b"").is_err());
}

#[test]
fn the_ptx_an_image_carries_for_a_device() {
    // A fatbin with compute_80 PTX: a device of 8.0 or newer can JIT it, a 7.5 cannot.
    for fat in [K_FATBIN, K_FATBIN_ZSTD] {
        // SAFETY: a fatbin in a live static.
        let mods = unsafe { image_ptx(fat.as_ptr()) }.unwrap();
        assert_eq!(mods, fatbin_ptx(fat).unwrap());
        let for90 = PtxModule::best_for(&mods, 90).expect("PTX for 9.0");
        assert!(for90.arch == 80 && for90.text.contains(".entry"));
        assert_eq!(PtxModule::best_for(&mods, 75), None);
        // Through the wrapper cudart registers (magic, version, data, filename).
        let mut w = FATBIN_WRAPPER_MAGIC.to_le_bytes().to_vec();
        w.extend_from_slice(&1u32.to_le_bytes());
        w.extend_from_slice(&(fat.as_ptr() as usize).to_le_bytes());
        w.extend_from_slice(&0usize.to_le_bytes());
        // SAFETY: a wrapper pointing at a live fatbin.
        assert_eq!(unsafe { image_ptx(w.as_ptr()) }.unwrap(), mods);
    }
    // The highest architecture that fits wins.
    let two = [
        PtxModule {
            arch: 90,
            text: "b".into(),
        },
        PtxModule {
            arch: 70,
            text: "a".into(),
        },
        PtxModule {
            arch: 120,
            text: "c".into(),
        },
    ];
    assert_eq!(PtxModule::best_for(&two, 100).unwrap().arch, 90);
    assert_eq!(PtxModule::best_for(&two, 80).unwrap().arch, 70);
    // A cubin carries none; PTX text is itself (architecture 0); other text is not PTX.
    // SAFETY: live statics / NUL-terminated locals.
    assert!(unsafe { image_ptx(K_CUBIN_SM80.as_ptr()) }
        .unwrap()
        .is_empty());
    let text = [K_PTX, b"\0"].concat();
    // SAFETY: a NUL-terminated PTX text.
    let ptx = unsafe { image_ptx(text.as_ptr()) }.unwrap();
    assert_eq!((ptx[0].arch, ptx[0].text.as_bytes()), (0, K_PTX));
    // SAFETY: a NUL-terminated text.
    assert!(unsafe { image_ptx(c"hello".as_ptr().cast()) }
        .unwrap()
        .is_empty());
    // SAFETY: NULL is refused before any read.
    assert!(unsafe { image_ptx(std::ptr::null()) }.is_err());
}
