//! `libshare.so`: the CUDA driver interposer (issue 3; not built yet).
