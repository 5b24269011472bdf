//! Registration: a shim asks the daemon (`<state dir>/register.sock`, or `$LIBSHARE_SOCKET`)
//! for its container's state file. The daemon learns who is asking from the kernel (the
//! peer's host pid, `SO_PEERCRED`) and its container from the pid's cgroup; the name the
//! process's environment claims counts only where the operator trusts it (`--trust-env`) and
//! the cgroup maps to no container. The answer carries the container's state file as an
//! `SCM_RIGHTS` descriptor, so a process never needs to reach (or be able to reach) any other
//! container's file by path.
//!
//! Messages are small, hand-encoded, little-endian (the shim links no serializer):
//! ```text
//! Hello:   magic "LSRG" | version u16 | name length u16 | claimed name (UTF-8, ≤ 128 bytes)
//! Welcome: magic "LSWL" | version u16 | status u8 (0 ok, 2 ok and the environment trusted,
//!          1 refused, 3 busy) | text length u16 | text (ok: the container's name; refused,
//!          busy: one line saying why)
//! ```

pub const VERSION: u16 = 1;
const HELLO_MAGIC: &[u8; 4] = b"LSRG";
const WELCOME_MAGIC: &[u8; 4] = b"LSWL";
/// Longest name or reason carried.
pub const MAX_TEXT: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// What the process's environment says its container is (`LIBSHARE_CONTAINER`), or empty.
    pub claimed: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Welcome {
    /// Registered in this container; its state file comes with the message. `env_trusted`:
    /// the daemon trusts the processes' environment (`--trust-env`), so their limits and class
    /// apply as without a daemon where the daemon has no settings; otherwise the daemon's word
    /// is the only one.
    Ok {
        container: String,
        env_trusted: bool,
    },
    /// Not registered, and why: a final answer (asking again gets the same).
    Refused { reason: String },
    /// Not registered now (the daemon is at a connection limit): ask again after a back-off.
    Busy { reason: String },
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(MAX_TEXT)];
    // Cut at a character boundary.
    let mut n = b.len();
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    out.extend_from_slice(&(n as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..n]);
}

/// Checks the magic and version; returns the rest.
fn header<'a>(b: &'a [u8], magic: &[u8; 4]) -> Result<&'a [u8], String> {
    if b.len() < 6 || &b[..4] != magic {
        return Err("not a libshare registration message".into());
    }
    let v = u16::from_le_bytes([b[4], b[5]]);
    if v != VERSION {
        return Err(format!(
            "registration protocol version {v}, this side speaks {VERSION}: update the shim and the daemon together"
        ));
    }
    Ok(&b[6..])
}

/// A length-prefixed text that must end the message.
fn text(b: &[u8]) -> Result<String, String> {
    if b.len() < 2 {
        return Err("registration message truncated".into());
    }
    let n = u16::from_le_bytes([b[0], b[1]]) as usize;
    if n > MAX_TEXT || b.len() != 2 + n {
        return Err("registration message has a bad length".into());
    }
    String::from_utf8(b[2..].to_vec()).map_err(|_| "registration text is not UTF-8".into())
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.claimed.len());
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        put_text(&mut out, &self.claimed);
        out
    }

    pub fn decode(b: &[u8]) -> Result<Hello, String> {
        let rest = header(b, HELLO_MAGIC)?;
        Ok(Hello {
            claimed: text(rest)?,
        })
    }
}

impl Welcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(WELCOME_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        let (status, t) = match self {
            Welcome::Ok {
                container,
                env_trusted,
            } => (if *env_trusted { 2u8 } else { 0u8 }, container),
            Welcome::Refused { reason } => (1u8, reason),
            Welcome::Busy { reason } => (3u8, reason),
        };
        out.push(status);
        put_text(&mut out, t);
        out
    }

    pub fn decode(b: &[u8]) -> Result<Welcome, String> {
        let rest = header(b, WELCOME_MAGIC)?;
        let (&status, rest) = rest.split_first().ok_or("registration message truncated")?;
        let t = text(rest)?;
        match status {
            0 | 2 => Ok(Welcome::Ok {
                container: t,
                env_trusted: status == 2,
            }),
            1 => Ok(Welcome::Refused { reason: t }),
            3 => Ok(Welcome::Busy { reason: t }),
            s => Err(format!("unknown registration status {s}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        for h in ["", "web", "é-ü"] {
            let m = Hello { claimed: h.into() };
            assert_eq!(Hello::decode(&m.encode()), Ok(m));
        }
        for w in [
            Welcome::Ok {
                container: "web".into(),
                env_trusted: true,
            },
            Welcome::Refused {
                reason: "no".into(),
            },
            Welcome::Busy {
                reason: "later".into(),
            },
        ] {
            assert_eq!(Welcome::decode(&w.encode()), Ok(w));
        }
        let mut old = Hello {
            claimed: "x".into(),
        }
        .encode();
        old[4] = 9;
        assert!(Hello::decode(&old).unwrap_err().contains("version"));
        let h = Hello {
            claimed: "abc".into(),
        }
        .encode();
        assert!(Hello::decode(&h[..h.len() - 1]).is_err(), "truncated");
        assert!(
            Hello::decode(&[h.clone(), vec![0]].concat()).is_err(),
            "trailing"
        );
        assert!(Welcome::decode(&h).is_err(), "a hello is no welcome");
        let long = "x".repeat(2 * MAX_TEXT);
        assert_eq!(
            Hello::decode(&Hello { claimed: long }.encode())
                .unwrap()
                .claimed
                .len(),
            MAX_TEXT
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Hello::decode(&b);
            let _ = Welcome::decode(&b);
        }

        #[test]
        fn hellos_and_welcomes_round_trip(s in "\\PC{0,100}", ok in any::<bool>()) {
            let h = Hello { claimed: s.clone() };
            prop_assert_eq!(Hello::decode(&h.encode()), Ok(h));
            let w = if ok { Welcome::Ok { container: s, env_trusted: true } } else { Welcome::Refused { reason: s } };
            prop_assert_eq!(Welcome::decode(&w.encode()), Ok(w));
        }
    }
}
