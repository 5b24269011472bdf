//! The few kernel results simgpu does produce. Kernels do not compute, so a value the host
//! reads back from memory a kernel should have written is whatever that memory held — after
//! PyTorch's caching allocator reuses a block, stale bytes of an earlier tensor. When such a
//! value is a *count* the host sizes a tensor with (`nonzero`, `unique`, masked indexing all
//! count with CUB before allocating), stale bytes make the job fail ("Storage size calculation
//! overflowed"). So the CUB kernels that produce those counts write a zero count, as if nothing
//! was selected:
//! - `DeviceCompactInitKernel(tile_state, num_tiles, d_num_selected_out)` initialises
//!   `*d_num_selected_out` to 0 (what it does on a GPU too);
//! - `DeviceReduceSingleTileKernel(d_in, d_out, …)` writes its result to `*d_out`: zero here;
//! - cuSOLVER's `…set_info_ker(int value, int *info)` sets the status word `*info` to `value`
//!   (0: success), which PyTorch checks after a factorisation (`torch.linalg.cholesky`, `inv`,
//!   `solve`).
//!
//! And PyTorch's contiguous fills (`torch.zeros`/`ones`/`full`, `fill_`, `zero_`: a
//! `vectorized_elementwise_kernel<…, FillFunctor<T>, std::array<char*, 1>>(N, {value}, {data})`)
//! write their value, so `torch.zeros` is zeros and a status PyTorch zero-initialises before a
//! library writes it (cuSOLVER's `info`) reads back as success.
//!
//! Sizes come from the kernel's mangled template arguments and parameter layout; a write
//! happens only if its whole range lies inside a device allocation, when the kernel executes in
//! stream order.

use crate::model::module::Function;
use crate::sim::Sim;

/// Size in bytes of the Itanium-mangled builtin type `code` (integers and floats only).
fn builtin_size(code: u8) -> Option<usize> {
    match code {
        b'a' | b'h' | b'c' | b'b' => Some(1),
        b's' | b't' => Some(2),
        b'i' | b'j' | b'f' => Some(4),
        b'l' | b'm' | b'x' | b'y' | b'd' => Some(8),
        _ => None,
    }
}

/// (parameter index, element size) of the scalar a CUB counting kernel writes, from its name.
fn scalar_output_of(name: &str) -> Option<(usize, usize)> {
    if name.contains("DeviceCompactInitKernel") {
        // ...DeviceCompactInitKernelI<ScanTileState<…>>P<type>EEvT_iT0_: the third parameter is a
        // pointer to the count.
        let tail = name.rfind("EEvT_iT0_")?;
        let b = name.as_bytes();
        (tail >= 2 && b[tail - 2] == b'P').then_some(())?;
        return Some((2, builtin_size(b[tail - 1])?));
    }
    if name.contains("DeviceReduceSingleTileKernel") {
        // ...policy_hubI<accumulator type>…: the second parameter is the output pointer.
        let at = name.find("policy_hubI")? + "policy_hubI".len();
        return Some((1, builtin_size(*name.as_bytes().get(at)?)?));
    }
    None
}

/// What a recognised kernel writes when it executes: `value` repeated `count` times at `addr`.
#[derive(Clone)]
pub struct Output {
    addr: u64,
    value: Vec<u8>,
    count: usize,
}

/// The kernel's argument `index` of the known layout, as bytes.
///
/// # Safety
/// `params` is the launch's kernelParams array (one readable pointer per parameter of `f`).
unsafe fn argument(
    f: &Function,
    params: *mut *mut std::ffi::c_void,
    index: usize,
) -> Option<Vec<u8>> {
    let p = f.params.as_ref()?.get(index)?;
    // SAFETY: kernelParams[index] points to argument `index`, `p.size` bytes long (its layout).
    let bytes =
        unsafe { std::slice::from_raw_parts(*params.add(index) as *const u8, p.size as usize) };
    Some(bytes.to_vec())
}

/// A contiguous PyTorch fill: (value, element count, data pointer).
///
/// # Safety
/// As for [`argument`].
unsafe fn fill(f: &Function, params: *mut *mut std::ffi::c_void) -> Option<Output> {
    let n = &f.name;
    if !(n.contains("vectorized_elementwise_kernel")
        && n.contains("FillFunctor")
        && n.contains("St5arrayIPcLm1E"))
        || f.params.as_ref()?.len() != 3
    {
        return None;
    }
    // SAFETY: this fn's contract.
    let (count, value, data) = unsafe {
        (
            argument(f, params, 0)?,
            argument(f, params, 1)?,
            argument(f, params, 2)?,
        )
    };
    let count = i32::from_ne_bytes(count.get(..4)?.try_into().ok()?);
    let addr = u64::from_ne_bytes(data.get(..8)?.try_into().ok()?);
    (count >= 0 && !value.is_empty()).then_some(Output {
        addr,
        value,
        count: count as usize,
    })
}

/// cuSOLVER's status initialisation: `*info = value`.
///
/// # Safety
/// As for [`argument`].
unsafe fn solver_info(f: &Function, params: *mut *mut std::ffi::c_void) -> Option<Output> {
    let layout = f.params.as_ref()?;
    if !(f.name.contains("set_info_ker") && f.name.ends_with("iPi"))
        || layout.len() != 2
        || layout[0].size != 4
        || layout[1].size != 8
    {
        return None;
    }
    // SAFETY: this fn's contract.
    let (value, info) = unsafe { (argument(f, params, 0)?, argument(f, params, 1)?) };
    Some(Output {
        addr: u64::from_ne_bytes(info.try_into().ok()?),
        value,
        count: 1,
    })
}

/// What this launch writes when it executes, if it is one of the kernels above and its whole
/// output lies in a device allocation.
///
/// # Safety
/// `params` is NULL or the launch's kernelParams array (the cuLaunchKernel contract).
pub unsafe fn output(s: &Sim, f: &Function, params: *mut *mut std::ffi::c_void) -> Option<Output> {
    if params.is_null() {
        return None;
    }
    // SAFETY: this fn's contract.
    let out = match unsafe { fill(f, params).or_else(|| solver_info(f, params)) } {
        Some(o) => o,
        None => {
            let (index, len) = scalar_output_of(&f.name)?;
            if f.params.as_ref()?.get(index)?.size != 8 {
                return None;
            }
            // SAFETY: this fn's contract; argument `index` is a pointer (8 bytes).
            let ptr = unsafe { argument(f, params, index)? };
            Output {
                addr: u64::from_ne_bytes(ptr.try_into().ok()?),
                value: vec![0; len],
                count: 1,
            }
        }
    };
    super::memory::device_range(s, out.addr, out.len()).map(|_| out)
}

impl Output {
    fn len(&self) -> u64 {
        (self.value.len() * self.count) as u64
    }

    /// Writes the output, if the memory is still a device allocation.
    pub fn write(&self, s: &Sim) {
        if super::memory::device_range(s, self.addr, self.len()).is_none() {
            return;
        }
        let k = self.value.len();
        // SAFETY: [addr, addr + len) lies inside a live device allocation, which is host memory
        // mapped by simgpu (checked just now); `value` is `k` bytes.
        unsafe {
            let dst = self.addr as *mut u8;
            if self.value.iter().all(|&b| b == 0) {
                std::ptr::write_bytes(dst, 0, k * self.count);
            } else {
                for i in 0..self.count {
                    std::ptr::copy_nonoverlapping(self.value.as_ptr(), dst.add(i * k), k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scalar_output_of;

    #[test]
    fn counting_kernels_are_recognised_from_their_mangled_names() {
        assert_eq!(
            scalar_output_of("_ZN14at_cuda_detail3cub6detail4scan23DeviceCompactInitKernelINS0_13ScanTileStateIiLb1EEEPlEEvT_iT0_"),
            Some((2, 8))
        );
        assert_eq!(
            scalar_output_of("_ZN14at_cuda_detail3cub6detail4scan23DeviceCompactInitKernelINS0_13ScanTileStateIiLb1EEEPiEEvT_iT0_"),
            Some((2, 4))
        );
        assert_eq!(
            scalar_output_of("_ZN14at_cuda_detail3cub6detail6reduce28DeviceReduceSingleTileKernelINS2_10policy_hubIiyN4cuda3std3__44plusIvEEE10Policy1000E"),
            Some((1, 4))
        );
        assert_eq!(scalar_output_of("_Z6kernelPf"), None);
    }
}
