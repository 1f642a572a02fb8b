//! Number scanning with the semantics of the C library routines NVIDIA's control daemon uses.
//!
//! The 535 daemon reads its arguments with `sscanf`/`strtol`/`strtoull`/`strtod`, so its
//! answers depend on their quirks: a valid prefix is enough (`12abc` is 12), overflow
//! saturates and is then truncated to the target width (`4294967297` read as `%d` is 1),
//! `strtoull` accepts a minus sign and negates modulo 2^64, and `strtod` understands hex
//! floats, `inf` and `nan`. These functions reproduce exactly that so the emulator answers
//! the same way; they work on one whitespace-free token or a string with leading blanks.

/// Characters C's `isspace` accepts in the "C" locale.
pub fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r')
}

/// Splits off an optional sign after leading C whitespace. Returns (negative, rest).
fn sign(s: &str) -> (bool, &str) {
    let s = s.trim_start_matches(is_c_space);
    if let Some(rest) = s.strip_prefix('-') {
        (true, rest)
    } else if let Some(rest) = s.strip_prefix('+') {
        (false, rest)
    } else {
        (false, s)
    }
}

/// Length of the run of ASCII decimal digits at the start of `s`.
fn digit_run(s: &str) -> usize {
    s.bytes().take_while(u8::is_ascii_digit).count()
}

/// Like `strtoull(s, &end, 10)`: returns the value and the text after the digits, or `None`
/// when no digit follows the optional sign (where `sscanf("%llu")` reports a failed match).
///
/// Overflow gives `u64::MAX` whatever the sign; otherwise a leading `-` negates modulo 2^64.
pub fn scan_u64(s: &str) -> Option<(u64, &str)> {
    let (neg, rest) = sign(s);
    let n = digit_run(rest);
    if n == 0 {
        return None;
    }
    let mut value: u64 = 0;
    let mut overflow = false;
    for b in rest[..n].bytes() {
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
    }
    let value = if overflow {
        u64::MAX
    } else if neg {
        value.wrapping_neg()
    } else {
        value
    };
    Some((value, &rest[n..]))
}

/// Like `strtol(s, &end, 10)` on a 64-bit `long`: saturates at `i64::MIN`/`i64::MAX`.
/// `None` when there is no digit.
pub fn scan_i64(s: &str) -> Option<(i64, &str)> {
    let (neg, rest) = sign(s);
    let n = digit_run(rest);
    if n == 0 {
        return None;
    }
    // Accumulate towards the sign so that i64::MIN itself is representable.
    let mut value: i64 = 0;
    for b in rest[..n].bytes() {
        let d = i64::from(b - b'0');
        let next = value.checked_mul(10).and_then(|v| {
            if neg {
                v.checked_sub(d)
            } else {
                v.checked_add(d)
            }
        });
        match next {
            Some(v) => value = v,
            None => {
                value = if neg { i64::MIN } else { i64::MAX };
                break;
            }
        }
    }
    Some((value, &rest[n..]))
}

/// `sscanf("%d")`: glibc converts with `strtol` and stores the low 32 bits.
pub fn scan_int(s: &str) -> Option<i32> {
    // Truncation to the low 32 bits is exactly what glibc does when it stores into an int.
    scan_i64(s).map(|(v, _)| v as i32)
}

/// `sscanf("%u")`: glibc converts with `strtoul` (64-bit) and stores the low 32 bits.
pub fn scan_uint(s: &str) -> Option<u32> {
    // Same truncation as glibc's store into an unsigned int.
    scan_u64(s).map(|(v, _)| v as u32)
}

/// `strtod(s, NULL)`: the value of the longest valid prefix, or `None` when there is none
/// (C would return 0.0 then; callers decide what that means).
pub fn scan_f64(s: &str) -> Option<f64> {
    let (neg, rest) = sign(s);
    let magnitude = scan_unsigned_f64(rest)?;
    Some(if neg { -magnitude } else { magnitude })
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn scan_unsigned_f64(s: &str) -> Option<f64> {
    if starts_with_ignore_case(s, "inf") {
        return Some(f64::INFINITY);
    }
    if starts_with_ignore_case(s, "nan") {
        return Some(f64::NAN);
    }
    if (s.starts_with("0x") || s.starts_with("0X")) && hex_float(&s[2..]).is_some() {
        return hex_float(&s[2..]);
    }
    decimal_float(s)
}

/// Decimal `digits[.digits][(e|E)[sign]digits]`, at least one mantissa digit.
fn decimal_float(s: &str) -> Option<f64> {
    let int_len = digit_run(s);
    let mut pos = int_len;
    let mut frac_len = 0;
    if s[pos..].starts_with('.') {
        frac_len = digit_run(&s[pos + 1..]);
        pos += 1 + frac_len;
    }
    if int_len == 0 && frac_len == 0 {
        return None;
    }
    let int_part = if int_len == 0 { "0" } else { &s[..int_len] };
    let mut text = String::from(int_part);
    if frac_len > 0 {
        text.push('.');
        text.push_str(&s[int_len + 1..int_len + 1 + frac_len]);
    }
    // An exponent only counts when digits follow it ("1e" reads as 1).
    let rest = &s[pos..];
    if rest.starts_with(['e', 'E']) {
        let (neg, after) = match &rest[1..] {
            r if r.starts_with('-') => (true, &r[1..]),
            r if r.starts_with('+') => (false, &r[1..]),
            r => (false, r),
        };
        let n = digit_run(after);
        if n > 0 {
            text.push('e');
            if neg {
                text.push('-');
            }
            // Keep the exponent parseable: anything beyond 5 digits over/underflows anyway.
            let digits = after[..n].trim_start_matches('0');
            if digits.len() > 5 {
                text.push_str("99999");
            } else if digits.is_empty() {
                text.push('0');
            } else {
                text.push_str(digits);
            }
        }
    }
    text.parse::<f64>().ok()
}

/// Hexadecimal float after the `0x`: `hexdigits[.hexdigits][(p|P)[sign]digits]`.
fn hex_float(s: &str) -> Option<f64> {
    let mut mantissa = 0f64;
    let mut exponent: i64 = 0;
    let mut any = false;
    let mut chars = s.char_indices().peekable();
    let mut end = s.len();
    let mut seen_point = false;
    while let Some(&(i, c)) = chars.peek() {
        if let Some(d) = c.to_digit(16) {
            mantissa = mantissa * 16.0 + f64::from(d);
            if seen_point {
                exponent -= 4;
            }
            any = true;
        } else if c == '.' && !seen_point {
            seen_point = true;
        } else {
            end = i;
            break;
        }
        chars.next();
    }
    if !any {
        return None;
    }
    let rest = &s[end..];
    if rest.starts_with(['p', 'P']) {
        if let Some((e, _)) = scan_i64_no_space(&rest[1..]) {
            exponent = exponent.saturating_add(e);
        }
    }
    let exponent = exponent.clamp(-2200, 2200) as i32;
    Some(mantissa * 2f64.powi(exponent))
}

/// `scan_i64` without skipping leading whitespace (an exponent must follow its marker).
fn scan_i64_no_space(s: &str) -> Option<(i64, &str)> {
    if s.starts_with(is_c_space) {
        None
    } else {
        scan_i64(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_prefix_sign_and_overflow() {
        assert_eq!(scan_u64("1G"), Some((1, "G")));
        assert_eq!(scan_u64("+3G"), Some((3, "G")));
        assert_eq!(scan_u64("-1G"), Some((u64::MAX, "G")));
        assert_eq!(scan_u64("99999999999999999999M"), Some((u64::MAX, "M")));
        assert_eq!(scan_u64("-99999999999999999999"), Some((u64::MAX, "")));
        assert_eq!(scan_u64("0x10M"), Some((0, "x10M")));
        assert_eq!(scan_u64("  42"), Some((42, "")));
        assert_eq!(scan_u64("xyz"), None);
        assert_eq!(scan_u64("-"), None);
        assert_eq!(scan_u64(""), None);
        assert_eq!(scan_u64("=2G"), None);
    }

    #[test]
    fn int_truncates_like_glibc() {
        assert_eq!(scan_int("12abc"), Some(12));
        assert_eq!(scan_int("-1"), Some(-1));
        assert_eq!(scan_int("4294967296"), Some(0));
        assert_eq!(scan_int("4294967297"), Some(1));
        assert_eq!(scan_int("4294967295"), Some(-1));
        assert_eq!(scan_int("99999999999"), Some(1_215_752_191));
        // strtol saturates at LONG_MAX, whose low 32 bits are all ones.
        assert_eq!(scan_int("99999999999999999999"), Some(-1));
        assert_eq!(scan_int("-99999999999999999999"), Some(0));
        assert_eq!(scan_int("0x1"), Some(0));
        assert_eq!(scan_int("010"), Some(10));
        assert_eq!(scan_int("abc"), None);
        assert_eq!(scan_int("GPU-5f3c0c52"), None);
        assert_eq!(scan_int("+1"), Some(1));
        assert_eq!(scan_int("-0"), Some(0));
    }

    #[test]
    fn uint_wraps_like_glibc() {
        assert_eq!(scan_uint("5"), Some(5));
        assert_eq!(scan_uint("-2"), Some(4_294_967_294));
        assert_eq!(scan_uint("3abc"), Some(3));
        assert_eq!(scan_uint("2.5"), Some(2));
        assert_eq!(scan_uint("abc"), None);
    }

    #[test]
    fn strtod_forms() {
        assert_eq!(scan_f64("50"), Some(50.0));
        assert_eq!(scan_f64("50abc"), Some(50.0));
        assert_eq!(scan_f64("12.345"), Some(12.345));
        assert_eq!(scan_f64("1e2"), Some(100.0));
        assert_eq!(scan_f64("1e-1"), Some(0.1));
        assert_eq!(scan_f64("1e"), Some(1.0));
        assert_eq!(scan_f64(".5"), Some(0.5));
        assert_eq!(scan_f64("5."), Some(5.0));
        assert_eq!(scan_f64("+7"), Some(7.0));
        assert_eq!(scan_f64("-5"), Some(-5.0));
        assert_eq!(scan_f64("0x10"), Some(16.0));
        assert_eq!(scan_f64("0x1.8p1"), Some(3.0));
        assert_eq!(scan_f64("0x"), Some(0.0));
        assert_eq!(scan_f64("inf"), Some(f64::INFINITY));
        assert_eq!(scan_f64("-Infinity"), Some(f64::NEG_INFINITY));
        assert!(scan_f64("nan").is_some_and(f64::is_nan));
        assert_eq!(scan_f64("1e999999999999"), Some(f64::INFINITY));
        assert_eq!(scan_f64("abc"), None);
        assert_eq!(scan_f64(""), None);
        assert_eq!(scan_f64("."), None);
    }
}
