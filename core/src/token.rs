//! Owner tokens: proof that a caller is the holder of a grant.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

/// A 128-bit random token that identifies one grant's holder.
///
/// Drawn from the operating system's CSPRNG, so another client cannot guess it and release or
/// extend a lock it does not hold. Rendered as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// Draws a fresh token from the operating system's random source.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            Error::new(ErrorKind::Backend, "core", "the operating system's random source failed")
                .with_source(Box::new(std::io::Error::other(e.to_string())))
        })?;
        Ok(OwnerToken(bytes))
    }

    /// Rebuilds a token from its bytes (for backends that store them).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parses the 32-hex-digit form.
    pub fn parse_hex(s: &str) -> Result<Self> {
        let bad = || Error::new(ErrorKind::InvalidArgument, "core", "owner token is not 32 hex digits");
        if s.len() != 32 || !s.is_ascii() {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(OwnerToken(out))
    }
}

impl OwnerToken {
    /// The 32 lowercase hex digits as bytes, without allocating (what backends send to a
    /// server on every request; `to_string()` gives the same text).
    pub fn to_hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 0x0f)];
        }
        out
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for OwnerToken {
    // Only a prefix: enough to correlate log lines, not enough to act as the holder.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({:02x}{:02x}{:02x}{:02x}…)", self.0[0], self.0[1], self.0[2], self.0[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_round_trip() {
        let a = OwnerToken::generate().unwrap();
        let b = OwnerToken::generate().unwrap();
        assert_ne!(a, b);
        let hex = a.to_string();
        assert_eq!(hex.len(), 32);
        assert_eq!(hex.as_bytes(), a.to_hex());
        assert_eq!(OwnerToken::from_bytes([0xab; 16]).to_string(), "ab".repeat(16));
        assert_eq!(OwnerToken::parse_hex(&hex).unwrap(), a);
        assert!(OwnerToken::parse_hex("zz").is_err());
        assert!(OwnerToken::parse_hex(&"é".repeat(16)).is_err());
        assert!(!format!("{a:?}").contains(&hex));
    }
}
