//! Shared-memory layout and admin-socket protocol between `libshare.so` and `sharectl daemon`.
//! (Filled in by issue 3: the shim.)
