//! Turns `cuda_driver_api.txt` into static tables (see src/lib.rs).
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda_driver_api.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    let text = std::fs::read_to_string(&list).expect("cuda_driver_api.txt");
    let (mut entries, mut exports) = (String::new(), std::collections::BTreeMap::new());
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.splitn(5, ' ').collect();
        if f[0] == "export" {
            exports.entry(f[1].to_string()).or_insert_with(String::new);
            continue;
        }
        let proto = f.get(4).copied().unwrap_or("()");
        writeln!(
            entries,
            "    ProcEntry {{ name: {:?}, version: {}, per_thread: {}, export: {:?} }},",
            f[0],
            f[1],
            f[2] != "0",
            f[3]
        )
        .unwrap();
        exports.insert(f[3].to_string(), proto.to_string());
    }
    let mut code = String::from(
        "// Generated from shim-headers/cuda_driver_api.txt by build.rs. DO NOT EDIT.\n",
    );
    writeln!(
        code,
        "pub static PROC_TABLE: &[ProcEntry] = &[\n{entries}];"
    )
    .unwrap();
    code.push_str("/// Every driver export: (symbol, C parameter list; empty if only declared).\npub static EXPORTS: &[(&str, &str)] = &[\n");
    for (name, proto) in &exports {
        writeln!(code, "    ({name:?}, {proto:?}),").unwrap();
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("tables.rs");
    std::fs::write(out, code).unwrap();
}
