//! Kubernetes resource quantities (`10Gi`, `1.5G`, `500M`, `1e9`) as whole bytes, rounded up
//! as `resource.Quantity.Value()` rounds.

/// Bytes of `s`, rounded up to a whole byte. Errors name the text and what was expected.
pub fn to_bytes(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let bad = |why: &str| format!("{s:?} is not a quantity: {why}");
    let (number, suffix) = split_number(s);
    if number.is_empty() {
        return Err(bad("expected digits"));
    }
    let (mantissa, exponent) = decimal(number).ok_or_else(|| bad("malformed number"))?;
    let (binary_shift, decimal_exp): (u32, i32) = match suffix {
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
        other => match other
            .strip_prefix(['e', 'E'])
            .and_then(|e| e.parse::<i32>().ok())
        {
            Some(e) => (0, e),
            None => return Err(bad("unknown suffix")),
        },
    };
    // value = mantissa * 10^(exponent + decimal_exp) * 2^binary_shift, rounded up.
    let exp = exponent + decimal_exp;
    let mut value = i128::from(mantissa) << binary_shift;
    if exp >= 0 {
        for _ in 0..exp {
            value = value.checked_mul(10).ok_or_else(|| bad("too large"))?;
        }
    } else {
        let mut divisor: i128 = 1;
        for _ in 0..(-exp) {
            divisor = divisor.checked_mul(10).ok_or_else(|| bad("too small"))?;
        }
        value = (value + divisor - 1) / divisor;
    }
    i64::try_from(value).map_err(|_| bad("too large"))
}

fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.' || *c == '+'))
        .map_or(s.len(), |(i, _)| i);
    s.split_at(end)
}

/// `12.34` → (1234, -2).
fn decimal(n: &str) -> Option<(u64, i32)> {
    let n = n.strip_prefix('+').unwrap_or(n);
    let (int, frac) = n.split_once('.').unwrap_or((n, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mantissa = digits.parse::<u64>().ok()?;
    Some((mantissa, -i32::try_from(frac.len()).ok()?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quantities_round_up_to_bytes() {
        assert_eq!(to_bytes("1Gi").unwrap(), 1 << 30);
        assert_eq!(to_bytes("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(to_bytes("10G").unwrap(), 10_000_000_000);
        assert_eq!(to_bytes("1e3").unwrap(), 1000);
        assert_eq!(to_bytes("1500m").unwrap(), 2);
        assert_eq!(to_bytes("123").unwrap(), 123);
        for bad in ["", "Gi", "1GB", "1..2", "99999999999Ei"] {
            assert!(to_bytes(bad).is_err(), "{bad}");
        }
    }
}
