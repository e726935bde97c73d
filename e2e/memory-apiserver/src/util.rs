//! Small helpers: time stamps, randomness, identifiers, query strings.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;

/// RFC 3339 time with second precision, as `metav1.Time` serializes.
pub(crate) fn now_rfc3339() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Seconds since an RFC 3339 time stamp, if it parses.
pub(crate) fn age_seconds(ts: &str) -> Option<i64> {
    let t: Timestamp = ts.parse().ok()?;
    Some(Timestamp::now().as_second() - t.as_second())
}

static RNG_STATE: AtomicU64 = AtomicU64::new(0);

/// A process-wide SplitMix64 generator: good enough for names, uids and fault dice.
pub(crate) fn random_u64() -> u64 {
    let mut seed = RNG_STATE.load(Ordering::Relaxed);
    if seed == 0 {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
        seed = nanos ^ (u64::from(std::process::id()) << 32) | 1;
        RNG_STATE.store(seed, Ordering::Relaxed);
    }
    let mut z = RNG_STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform float in [0, 1).
pub(crate) fn random_f64() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A version 4 style UUID.
pub(crate) fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    let a = (a & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
    let b = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

/// The five character suffix `generateName` appends (same alphabet as the real server).
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// Decodes `%XX` escapes and `+` in a query component.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex_val(bytes[i + 1]), hex_val(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Parses a query string into a map (last value wins).
pub(crate) fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    let mut map = HashMap::new();
    if let Some(q) = q {
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            map.insert(percent_decode(k), percent_decode(v));
        }
    }
    map
}

/// Lower-case hex encoding (continue tokens).
pub(crate) fn hex_encode(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// Inverse of [`hex_encode`].
pub(crate) fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.as_bytes().chunks(2).map(|c| Some(hex_val(c[0])? << 4 | hex_val(c[1])?)).collect()
}

/// Resident set size of this process in bytes (Linux), for benchmarks.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_handles_escapes_and_plus() {
        assert_eq!(percent_decode("a%3Db%2Cc+d"), "a=b,c d");
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn uids_look_like_uuids_and_differ() {
        let a = new_uid();
        assert_eq!(a.len(), 36);
        assert_ne!(a, new_uid());
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex_decode(&hex_encode(b"ns/name\x00")).unwrap(), b"ns/name\x00");
    }
}
