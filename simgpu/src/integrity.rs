//! The integrity check cudart runs against the driver (export table INTEGRITY_CHECK, slot 1):
//! HMAC (RFC 2104) over MD2 (RFC 1319) with a fixed key, over a message that binds the driver
//! version, the caller, the export-table addresses and every device's UUID and PCI address.
//! Facts from `shared/reference/cuda-export-tables.md`.

use hmac::{Hmac, Mac};
use md2::Md2;

const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// What identifies one device in the message.
pub struct DeviceId {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

pub struct Input<'a> {
    pub driver_version: u32,
    pub version: u32,
    pub pid: u32,
    pub thread: u32,
    pub cudart_interface_table: u64,
    pub integrity_table: u64,
    pub check_fn: u64,
    pub unix_seconds: u64,
    pub devices: &'a [DeviceId],
}

/// The two u64 cudart expects for `input.version`.
pub fn check(input: &Input) -> [u64; 2] {
    match input.version % 10 {
        0 => [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8],
        1 => [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8],
        _ => {
            let mut mac =
                <Hmac<Md2> as Mac>::new_from_slice(&KEY).expect("any key length is valid");
            for v in [input.driver_version, input.version, input.pid, input.thread] {
                mac.update(&v.to_le_bytes());
            }
            for v in [
                input.cudart_interface_table,
                input.integrity_table,
                input.check_fn,
                input.unix_seconds,
            ] {
                mac.update(&v.to_le_bytes());
            }
            for d in input.devices {
                mac.update(&d.uuid);
                for v in [d.pci_domain, d.pci_bus, d.pci_device] {
                    mac.update(&v.to_le_bytes());
                }
            }
            let h = mac.finalize().into_bytes();
            [
                u64::from_le_bytes(h[0..8].try_into().unwrap()),
                u64::from_le_bytes(h[8..16].try_into().unwrap()),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_md2_matches_rfc_construction() {
        // HMAC by hand (block size 16) must equal the crate composition we rely on.
        use md2::Digest;
        let msg = b"simgpu integrity";
        let mut ipad = [0x36u8; 16];
        let mut opad = [0x5cu8; 16];
        for i in 0..16 {
            ipad[i] ^= KEY[i];
            opad[i] ^= KEY[i];
        }
        let inner = Md2::new().chain_update(ipad).chain_update(msg).finalize();
        let outer = Md2::new().chain_update(opad).chain_update(inner).finalize();
        let mut mac = <Hmac<Md2> as Mac>::new_from_slice(&KEY).unwrap();
        mac.update(msg);
        assert_eq!(mac.finalize().into_bytes()[..], outer[..]);
    }

    #[test]
    fn fixed_answers_and_sensitivity() {
        let dev = [DeviceId {
            uuid: [7; 16],
            pci_domain: 0,
            pci_bus: 16,
            pci_device: 0,
        }];
        let mut i = Input {
            driver_version: 13050,
            version: 20,
            pid: 1,
            thread: 2,
            cudart_interface_table: 3,
            integrity_table: 4,
            check_fn: 5,
            unix_seconds: 6,
            devices: &dev,
        };
        assert_eq!(check(&i), [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]);
        i.version = 22;
        let a = check(&i);
        i.pid = 9;
        assert_ne!(a, check(&i));
    }
}
