//! Kernel slicing's PTX rewrite (issue 31, build 3) on what the compiler writes: the jobs' PTX
//! (`jobs/src/*.ptx`) and every test program's CUDA source (`tests/cuda/*.cu`, with
//! `slice_corpus.cu` written for this) compiled by nvcc 13.5 to PTX for compute_80 and
//! compute_90 (and `slice_corpus.cu` with `-lineinfo` and with `-G`). Each module is rewritten by `libshare_slice::rewrite`; the slice module must pass
//! the pinned toolkit's `ptxas` for sm_80 and sm_90, compiling exactly the sliced entries (and the
//! originals a body names), and `slice_corpus.cu`'s kernels must be sliced or refused as their
//! names say. What ptxas cannot show, that a sliced range computes what the whole launch does,
//! is the rewrite's unit tests' (the block index each instruction reads) and a real GPU's.

use libshare_slice::{rewrite, Outcome, Refusal};
use libshare_tests::{compile_ptx, ptxas, workspace_root};
use std::collections::BTreeSet;
use std::process::Command;

/// `ptxas -v` of `ptx` for `arch`: the entries it compiled, or its complaint.
fn ptxas_entries(ptx: &str, arch: &str, what: &str) -> Result<BTreeSet<String>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.ptx");
    std::fs::write(&file, ptx).unwrap();
    let out = Command::new(ptxas())
        .args(["-v", &format!("-arch={arch}"), "-o"])
        .arg(dir.path().join("m.cubin"))
        .arg(&file)
        .output()
        .expect("run ptxas");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{what} for {arch}: {text}"));
    }
    Ok(text
        .lines()
        .filter_map(|l| l.split("Compiling entry function '").nth(1))
        .filter_map(|l| l.split('\'').next())
        .map(str::to_owned)
        .collect())
}

/// The modules of the corpus: (what, PTX, the ptxas architectures it is for).
fn corpus() -> Vec<(String, String, Vec<&'static str>)> {
    let mut out = Vec::new();
    let jobs = workspace_root().join("jobs/src");
    for f in std::fs::read_dir(&jobs).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "ptx") {
            let name = p
                .strip_prefix(workspace_root())
                .unwrap()
                .display()
                .to_string();
            out.push((
                name,
                std::fs::read_to_string(&p).unwrap(),
                vec!["sm_80", "sm_90"],
            ));
        }
    }
    let cuda = workspace_root().join("tests/cuda");
    let mut sources: Vec<_> = std::fs::read_dir(&cuda)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .filter(|p| std::fs::read_to_string(p).unwrap().contains("__global__"))
        .collect();
    sources.sort();
    for src in sources {
        let file = src.file_name().unwrap().to_string_lossy().into_owned();
        for (virt, real) in [("compute_80", "sm_80"), ("compute_90", "sm_90")] {
            let ptx = std::fs::read_to_string(compile_ptx(&file, virt, &[])).unwrap();
            out.push((format!("{file} ({virt})"), ptx, vec![real]));
        }
    }
    // Line tables and full debug information: `.loc` directives and DWARF sections whose labels
    // are inside the entries.
    for flags in [&["-lineinfo"][..], &["-G"]] {
        let ptx =
            std::fs::read_to_string(compile_ptx("slice_corpus.cu", "compute_80", flags)).unwrap();
        out.push((
            format!("slice_corpus.cu (compute_80 {})", flags[0]),
            ptx,
            vec!["sm_80"],
        ));
    }
    out
}

#[test]
fn slice_modules_of_compiled_kernels_pass_ptxas_for_sm_80_and_sm_90() {
    let mut kernels = 0;
    let mut sliced = 0;
    let mut refusals: Vec<(String, String)> = Vec::new();
    for (what, ptx, arches) in corpus() {
        let r = rewrite(&ptx).unwrap_or_else(|e| panic!("{what}: {e}"));
        kernels += r.kernels.len();
        sliced += r.sliced();
        let mut expected: BTreeSet<String> = BTreeSet::new();
        for k in &r.kernels {
            match &k.outcome {
                Outcome::Sliced { entry, .. } => {
                    expected.insert(entry.clone());
                }
                Outcome::Whole(why) => {
                    refusals.push((format!("{what}: {}", k.name), why.to_string()))
                }
            }
        }
        for arch in arches {
            let original = ptxas_entries(&ptx, arch, &format!("{what} as compiled")).unwrap();
            let compiled = ptxas_entries(&r.ptx, arch, &format!("{what} sliced"))
                .unwrap_or_else(|e| panic!("{e}\n--- slice module ---\n{}", r.ptx));
            let kept: BTreeSet<String> = compiled.intersection(&original).cloned().collect();
            let new: BTreeSet<String> = compiled.difference(&original).cloned().collect();
            assert_eq!(
                new, expected,
                "{what} for {arch}: the entries ptxas compiled"
            );
            assert!(
                kept.iter().all(|k| r.ptx.contains(&format!(".entry {k}("))),
                "{what}: {kept:?}"
            );
        }
    }
    eprintln!("{sliced} of {kernels} kernels sliced; whole:");
    for (k, why) in &refusals {
        eprintln!("  {k}: {why}");
    }
    assert!(kernels >= 60, "the corpus has {kernels} kernels");
    // Each refusal is one slice_corpus.cu asks for, or a test program's kernel that writes a
    // `__device__` variable (those programs exercise symbols).
    for (k, why) in &refusals {
        assert!(
            k.contains("whole_") || why.contains("module variable"),
            "refused: {k}: {why}"
        );
    }
    assert!(sliced * 4 >= kernels * 3, "{sliced} of {kernels} sliced");
}

#[test]
fn the_corpus_kernels_are_sliced_or_refused_as_their_names_say() {
    for (virt, expect_cluster) in [("compute_80", false), ("compute_90", true)] {
        let ptx = std::fs::read_to_string(compile_ptx("slice_corpus.cu", virt, &[])).unwrap();
        let r = rewrite(&ptx).unwrap();
        let mut seen_cluster = false;
        for k in &r.kernels {
            let name = &k.name;
            match &k.outcome {
                Outcome::Sliced {
                    entry, params_at, ..
                } => {
                    assert!(name.contains("sliced_"), "{virt}: {name} was sliced");
                    assert_eq!(entry, &format!("{name}__ls_slice"));
                    assert_eq!(params_at % 4, 0);
                }
                Outcome::Whole(why) => {
                    let want = match () {
                        _ if name.contains("whole_callee_reads_index") => {
                            matches!(why, Refusal::CalleeReadsIndex(_))
                        }
                        _ if name.contains("whole_module_variable") => {
                            *why == Refusal::ModuleVariable("coefficients".into())
                        }
                        _ if name.contains("whole_device_counter") => {
                            *why == Refusal::ModuleVariable("counter".into())
                        }
                        _ if name.contains("whole_cluster") => {
                            seen_cluster = true;
                            *why == Refusal::Cluster
                        }
                        _ => false,
                    };
                    assert!(want, "{virt}: {name} runs whole: {why}");
                }
            }
        }
        assert_eq!(seen_cluster, expect_cluster, "{virt}: the cluster kernel");
        let sliced = r
            .kernels
            .iter()
            .filter(|k| k.name.contains("sliced_"))
            .count();
        assert_eq!(sliced, r.sliced(), "{virt}: every sliced_ kernel is sliced");
        assert!(sliced >= 12, "{virt}: {sliced} sliced_ kernels in the PTX");
    }
}

/// The PTX a program carries: nvcc -arch=sm_80 puts compute_80 PTX beside the sm_80 cubin in the
/// program's `.nv_fatbin` section; read back from the binary and rewritten, it passes ptxas.
#[test]
fn the_ptx_in_a_programs_fatbin_is_found_rewritten_and_compiles() {
    let program = libshare_tests::compile_cu("rt_streams.cu", libshare_tests::CudartLink::Shared);
    let bytes = std::fs::read(&program).unwrap();
    let fatbins = cuda_image::host_fatbins(&bytes).expect("an ELF");
    assert!(!fatbins.is_empty(), "{}: no fatbin", program.display());
    let ptx: Vec<_> = fatbins
        .iter()
        .flat_map(|f| cuda_image::fatbin_ptx(f).expect("fatbin_ptx"))
        .collect();
    assert!(
        ptx.iter().any(|m| m.arch == 80),
        "no compute_80 PTX: {ptx:?}"
    );
    let compiled =
        std::fs::read_to_string(compile_ptx("rt_streams.cu", "compute_80", &[])).unwrap();
    for m in &ptx {
        let r = rewrite(&m.text).unwrap();
        assert!(r.sliced() >= 1, "{:?}", r.kernels);
        // The same kernels as nvcc -ptx of the source.
        assert_eq!(rewrite(&compiled).unwrap().kernels, r.kernels);
        ptxas_entries(&r.ptx, "sm_80", "rt_streams' carried PTX").unwrap();
    }
}
