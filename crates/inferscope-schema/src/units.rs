//! Quantities as people write them on command lines: byte sizes.
//!
//! `--kv-cache-memory 1GiB`, `--max-request-body-bytes 16MiB`, `2G` or
//! plain bytes. The suffixes follow Kubernetes' resource quantities (the
//! form the deploy manifests use): `K`, `M`, `G`, `T` are powers of 1000,
//! `Ki`, `Mi`, `Gi`, `Ti` powers of 1024; a trailing `B` and the case of
//! the letters do not matter, and a decimal fraction is allowed when the
//! result is whole bytes (`1.5GiB`).

/// A byte size that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid size {input:?}: {why} (write bytes, or a number with a unit: 512MiB, 1GiB, 2G, 1.5GB; K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024)"
)]
pub struct ByteSizeError {
    input: String,
    why: &'static str,
}

/// Reads a byte size: `4096`, `512MiB`, `1GiB`, `2G`, `1.5 GB`.
pub fn parse_bytes(input: &str) -> Result<u64, ByteSizeError> {
    let err = |why| ByteSizeError {
        input: input.to_owned(),
        why,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let unit = unit.trim_start().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let scale: u64 = match unit {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        _ => return Err(err("unknown unit")),
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(err("no number"));
    }
    if frac.contains('.') {
        return Err(err("not a number"));
    }
    // Exact integer arithmetic: whole·scale + frac·scale / 10^len(frac).
    let parse = |d: &str| {
        if d.is_empty() {
            Ok(0)
        } else {
            d.parse::<u64>().map_err(|_| err("too large"))
        }
    };
    let too_large = || err("too large");
    let whole = parse(whole)?.checked_mul(scale).ok_or_else(too_large)?;
    let frac_digits = u32::try_from(frac.len()).map_err(|_| too_large())?;
    let denom = 10u64.checked_pow(frac_digits).ok_or_else(too_large)?;
    let frac = u128::from(parse(frac)?) * u128::from(scale);
    if frac % u128::from(denom) != 0 {
        return Err(err("not a whole number of bytes"));
    }
    let frac = u64::try_from(frac / u128::from(denom)).map_err(|_| too_large())?;
    whole.checked_add(frac).ok_or_else(too_large)
}

/// [`parse_bytes`] for a size held in a `usize`.
pub fn parse_bytes_usize(input: &str) -> Result<usize, ByteSizeError> {
    let v = parse_bytes(input)?;
    usize::try_from(v).map_err(|_| ByteSizeError {
        input: input.to_owned(),
        why: "too large",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sizes_people_write() {
        for (s, v) in [
            ("4096", 4096),
            ("0", 0),
            ("512MiB", 512 << 20),
            ("1GiB", 1 << 30),
            ("1gib", 1 << 30),
            ("1Gi", 1 << 30),
            ("2G", 2_000_000_000),
            ("2GB", 2_000_000_000),
            ("2 GB", 2_000_000_000),
            ("16KiB", 16 << 10),
            ("3k", 3000),
            ("1.5GiB", 3 << 29),
            ("0.5KiB", 512),
            (".5K", 500),
            ("2TiB", 2 << 40),
            ("100B", 100),
            (" 7 ", 7),
        ] {
            assert_eq!(parse_bytes(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for (s, why) in [
            ("", "no number"),
            ("GiB", "no number"),
            ("1 GiBs", "unknown unit"),
            ("1PB", "unknown unit"),
            ("-1", "unknown unit"),
            ("1.2.3", "not a number"),
            ("0.3", "not a whole number of bytes"),
            ("1.0000001K", "not a whole number of bytes"),
            ("18446744073709551616", "too large"),
            ("20000000TiB", "too large"),
        ] {
            let e = parse_bytes(s).expect_err(s);
            assert_eq!(e.why, why, "{s}");
            assert!(e.to_string().contains("512MiB"), "{e}");
        }
    }
}
