//! Kubernetes `resource.Quantity` values, as NVIDIA's MPS memory limits use them.
//!
//! Grammar (from the Kubernetes API conventions): an optionally signed decimal number
//! (`5`, `1.5`, `.5`, `5.`) followed by one suffix: a binary SI suffix (`Ki`, `Mi`, `Gi`, `Ti`,
//! `Pi`, `Ei`), a decimal SI suffix (`m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal
//! exponent (`e3`, `E-2`). The byte count of a fractional result is rounded up, as
//! `Quantity.Value()` does; whole MiB are then taken by truncating, as NVIDIA's DRA driver
//! normalizes pinned-memory limits (`10Gi` → 10240, `10M` → 9, `1G` → 953).

use serde_json::Value;

use super::value::{show, show_str};
use super::ConfigError;

/// Bytes in one MiB.
pub const MIB: u64 = 1024 * 1024;

/// Largest byte count accepted: `i64::MAX`, the most a Kubernetes quantity's `Value()` holds.
pub const MAX_BYTES: u64 = i64::MAX as u64;

/// Most digits accepted in the number part of a quantity (integer plus fraction).
const MAX_DIGITS: usize = 30;

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a Kubernetes quantity at all.
    #[error("not a Kubernetes quantity (expected a number with an optional suffix such as Ki, Mi, Gi, k, M, G or e9)")]
    Syntax,
    /// A negative amount.
    #[error("must not be negative")]
    Negative,
    /// More than [`MAX_BYTES`] bytes, or more digits than we handle.
    #[error("is too large (at most {MAX_BYTES} bytes)")]
    TooLarge,
}

/// Parses a Kubernetes quantity such as `8Gi`, `512Ki`, `1G`, `1.5Gi` or `1e9` into bytes,
/// rounding a fractional byte count up (as `resource.Quantity.Value()` does).
pub fn parse_quantity_bytes(text: &str) -> Result<u64, QuantityError> {
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = rest.split_at(number_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(QuantityError::Syntax);
    }
    let digits = int_part.len() + frac_part.len();
    if digits > MAX_DIGITS {
        return Err(QuantityError::TooLarge);
    }
    // mantissa / 10^frac digits, both exact in u128 (at most 30 digits).
    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa * 10 + u128::from(b - b'0');
    }
    // The value is mantissa * 2^bin * 10^dec10 (dec10 may be negative).
    let (binary_shift, mut dec10): (u32, i64) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => (0, parse_exponent(suffix)?),
    };
    if negative && mantissa != 0 {
        return Err(QuantityError::Negative);
    }
    if mantissa == 0 {
        return Ok(0);
    }
    dec10 -= i64::try_from(frac_part.len()).map_err(|_| QuantityError::TooLarge)?;
    // 10^19 > i64::MAX and the mantissa is at least 1: anything above is too large; a value
    // scaled below 10^-38 with at most 30 digits is below one byte.
    if dec10 > 19 {
        return Err(QuantityError::TooLarge);
    }
    if dec10 < -38 {
        return Ok(1);
    }
    let mut numerator = mantissa
        .checked_mul(1u128 << binary_shift)
        .ok_or(QuantityError::TooLarge)?;
    let mut denominator: u128 = 1;
    let scale = 10u128.pow(dec10.unsigned_abs() as u32);
    if dec10 >= 0 {
        numerator = numerator
            .checked_mul(scale)
            .ok_or(QuantityError::TooLarge)?;
    } else {
        denominator = scale;
    }
    let bytes = numerator.div_ceil(denominator);
    u64::try_from(bytes)
        .ok()
        .filter(|b| *b <= MAX_BYTES)
        .ok_or(QuantityError::TooLarge)
}

/// The exponent of a `e<n>` / `E<n>` suffix (`n` an optionally signed integer).
fn parse_exponent(suffix: &str) -> Result<i64, QuantityError> {
    let digits = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))
        .ok_or(QuantityError::Syntax)?;
    let unsigned = digits
        .strip_prefix('-')
        .or_else(|| digits.strip_prefix('+'))
        .unwrap_or(digits);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError::Syntax);
    }
    // Exponents beyond ±10^6 are nonsense for memory sizes; clamp instead of overflowing.
    let magnitude: i64 = if unsigned.len() > 6 {
        1_000_000
    } else {
        unsigned.parse().map_err(|_| QuantityError::Syntax)?
    };
    Ok(if digits.starts_with('-') {
        -magnitude
    } else {
        magnitude
    })
}

/// Whole MiB of `bytes`, truncated, as NVIDIA's DRA driver normalizes MPS limits.
pub fn bytes_to_mib(bytes: u64) -> u64 {
    bytes / MIB
}

/// Reads a pinned-memory limit found at `path`: a quantity string or a JSON number, converted
/// to whole MiB (truncated). Anything below 1 MiB is refused with "value set too low", as
/// NVIDIA's DRA driver refuses it; the error code is `InvalidConfig`.
pub(crate) fn limit_mib(value: &Value, path: &str) -> Result<u64, ConfigError> {
    let text = match value {
        Value::String(s) => s.clone(),
        // A JSON number is read as the quantity its digits spell (`1e9`, `1048576`).
        Value::Number(n) => n.to_string(),
        other => {
            return Err(ConfigError::invalid_config(format!(
                "{path}: expected a Kubernetes quantity such as \"8Gi\", got {}",
                show(other)
            )))
        }
    };
    let bytes = parse_quantity_bytes(&text).map_err(|e| {
        ConfigError::invalid_config(format!("{path}: quantity {} {e}", show_str(&text)))
    })?;
    let mib = bytes_to_mib(bytes);
    if mib < 1 {
        return Err(ConfigError::invalid_config(format!(
            "{path}: value set too low: {} is {bytes} bytes, below the 1 MiB minimum of an MPS pinned memory limit",
            show(value)
        )));
    }
    Ok(mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_to_bytes_and_mib() {
        // (input, bytes, MiB) — the MiB column includes the examples of research §1.2.
        let table: &[(&str, u64, u64)] = &[
            ("10Gi", 10 << 30, 10240),
            ("1Gi", 1 << 30, 1024),
            ("10Mi", 10 << 20, 10),
            ("10M", 10_000_000, 9),
            ("1G", 1_000_000_000, 953),
            ("8Gi", 8 << 30, 8192),
            ("20Gi", 20 << 30, 20480),
            ("1.5Gi", 3 << 29, 1536),
            ("0.5Gi", 1 << 29, 512),
            (".5Gi", 1 << 29, 512),
            ("2.Gi", 2 << 30, 2048),
            ("1e9", 1_000_000_000, 953),
            ("1E9", 1_000_000_000, 953),
            ("1e+9", 1_000_000_000, 953),
            ("25e8", 2_500_000_000, 2384),
            ("1048576", 1 << 20, 1),
            ("1024Ki", 1 << 20, 1),
            ("1000k", 1_000_000, 0),
            ("+4Mi", 4 << 20, 4),
            ("1Ti", 1 << 40, 1 << 20),
            ("1Ei", 1 << 60, 1 << 40),
            ("2E", 2_000_000_000_000_000_000, 1_907_348_632_812),
            ("1500m", 2, 0),
            ("1m", 1, 0),
            ("0", 0, 0),
            ("-0", 0, 0),
            ("0.000Gi", 0, 0),
            ("1e-3", 1, 0),
            ("1e-100", 1, 0),
        ];
        for (text, bytes, mib) in table {
            let got = parse_quantity_bytes(text);
            assert_eq!(got, Ok(*bytes), "bytes of {text}");
            assert_eq!(bytes_to_mib(*bytes), *mib, "MiB of {text}");
        }
    }

    #[test]
    fn bad_quantities() {
        for text in [
            "", "Gi", "8GB", "8gi", "8 Gi", " 8Gi", "8Gi ", "1.2.3", "e9", "1e", "1e+", "1ee9",
            "0x10", "1Ki1", "1K", "..5", "-",
        ] {
            assert_eq!(
                parse_quantity_bytes(text),
                Err(QuantityError::Syntax),
                "{text:?}"
            );
        }
        for text in ["-1Gi", "-1", "-0.5"] {
            assert_eq!(
                parse_quantity_bytes(text),
                Err(QuantityError::Negative),
                "{text}"
            );
        }
        for text in [
            "8Ei",
            "10E",
            "1e19",
            "1e1000000000",
            "1234567890123456789012345678901",
        ] {
            assert_eq!(
                parse_quantity_bytes(text),
                Err(QuantityError::TooLarge),
                "{text}"
            );
        }
        assert_eq!(parse_quantity_bytes("7Ei"), Ok(7 << 60));
    }

    #[test]
    fn limits_in_mib() {
        let path = "x.defaultPinnedDeviceMemoryLimit";
        assert_eq!(limit_mib(&Value::from("10Gi"), path), Ok(10240));
        assert_eq!(limit_mib(&serde_json::json!(1e9), path), Ok(953));
        assert_eq!(limit_mib(&serde_json::json!(2097152), path), Ok(2));
        for (value, needle) in [
            (Value::from("512Ki"), "value set too low"),
            (serde_json::json!(1000), "value set too low"),
            (Value::from("1000k"), "value set too low"),
            (Value::from("8GB"), "not a Kubernetes quantity"),
            (Value::from("-1Gi"), "must not be negative"),
            (serde_json::json!(true), "expected a Kubernetes quantity"),
        ] {
            let err = limit_mib(&value, path).expect_err("must be refused");
            assert_eq!(err.code, gpushare_proto::ErrorCode::InvalidConfig);
            assert!(err.message.contains(needle), "{}", err.message);
            assert!(err.message.contains(path), "{}", err.message);
            let shown = match &value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            assert!(err.message.contains(&shown), "{}", err.message);
        }
    }
}
