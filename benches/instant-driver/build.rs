fn main() {
    // Loaded as the "real" driver by libshare.so (LIBSHARE_REAL_LIBCUDA): name it like one.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
