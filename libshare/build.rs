fn main() {
    // The shim's own references to its hooks must not be interposed by anything else.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libshare.so");
}
