//! NVML subset (to be filled in).
