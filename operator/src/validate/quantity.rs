//! Kubernetes resource quantities (pure): `500m`, `2`, `1.5Gi`, `1e3`, parsed exactly into
//! nano-units so that a resource author's requests and limits compare with the installation's
//! maximum the way the API server compares them.

/// A quantity in nano-units (`1` is 1,000,000,000): exact for every suffix Kubernetes accepts, up
/// to exa (`E`, `Ei`) and down to nano (`n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount(i128);

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a number with an optional sign, fraction, exponent and suffix.
    #[error("is not a Kubernetes quantity (a number with an optional suffix, e.g. 500m, 2, 1Gi)")]
    Malformed,
    /// The number is beyond what any resource of a container could mean.
    #[error("is out of range")]
    OutOfRange,
}

impl Amount {
    /// Parse `text` as Kubernetes does (`resource.ParseQuantity`): a decimal number, optionally
    /// signed, with an optional decimal exponent (`e3`) or suffix (`n u m k M G T P E`,
    /// `Ki Mi Gi Ti Pi Ei`). Precision below a nano-unit is rounded up, as the API server does.
    pub fn parse(text: &str) -> Result<Amount, QuantityError> {
        let text = text.trim();
        let (sign, rest) = match text.as_bytes().first() {
            Some(b'-') => (-1, &text[1..]),
            Some(b'+') => (1, &text[1..]),
            _ => (1, text),
        };
        let number_end = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(QuantityError::Malformed);
        }
        // Binary suffixes multiply; decimal ones and exponents shift the decimal point.
        let (multiplier, exponent): (i128, i32) = match suffix {
            "" => (1, 0),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            other => match other.strip_prefix(['e', 'E']) {
                Some(e) if !e.is_empty() => (1, e.parse::<i32>().map_err(|_| QuantityError::Malformed)?),
                _ => return Err(QuantityError::Malformed),
            },
        };
        if !(-30..=30).contains(&exponent) || whole.len() + fraction.len() > 30 {
            return Err(QuantityError::OutOfRange);
        }
        let digits: String = [whole, fraction].concat();
        let mantissa: i128 =
            if digits.is_empty() { 0 } else { digits.parse().map_err(|_| QuantityError::Malformed)? };
        // value = mantissa * multiplier * 10^(exponent - fraction digits), in nano-units (+9).
        let shift = exponent - fraction.len() as i32 + 9;
        let scaled = mantissa.checked_mul(multiplier).ok_or(QuantityError::OutOfRange)?;
        let nanos = if shift >= 0 {
            scaled.checked_mul(10i128.pow(shift as u32)).ok_or(QuantityError::OutOfRange)?
        } else {
            let divisor = 10i128.pow((-shift) as u32);
            (scaled + divisor - 1) / divisor
        };
        Ok(Amount(sign * nanos))
    }

    /// The amount in nano-units.
    pub fn nanos(self) -> i128 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One unit, in nano-units.
    const ONE: i128 = 1_000_000_000;

    #[test]
    fn quantities_parse_into_exact_nano_units_with_every_suffix() {
        let cases = [
            ("2", 2 * ONE),
            ("500m", ONE / 2),
            ("0.5", ONE / 2),
            (".5", ONE / 2),
            ("1.5Gi", 3 * (1 << 29) * ONE),
            ("64Mi", 64 * (1 << 20) * ONE),
            ("1Ki", 1024 * ONE),
            ("1k", 1000 * ONE),
            ("1e3", 1000 * ONE),
            ("1E3", 1000 * ONE),
            ("2G", 2_000_000_000 * ONE),
            ("1n", 1),
            ("1u", 1000),
            ("+1", ONE),
            ("-1", -ONE),
            ("8Ei", (1i128 << 63) * ONE),
        ];
        for (text, nanos) in cases {
            assert_eq!(Amount::parse(text).map(Amount::nanos), Ok(nanos), "{text}");
        }
        assert!(Amount::parse("2Gi").unwrap() > Amount::parse("2G").unwrap());
        assert!(Amount::parse("2049Mi").unwrap() > Amount::parse("2Gi").unwrap());
        assert_eq!(Amount::parse("2000m"), Amount::parse("2"));
    }

    #[test]
    fn malformed_or_absurd_quantities_are_refused() {
        for text in ["", "m", "1.2.3", "1x", "Gi", "1 Gi", "1e", "1ee3", "--1", "1Gii"] {
            assert_eq!(Amount::parse(text), Err(QuantityError::Malformed), "{text:?}");
        }
        for text in ["1e40", "1234567890123456789012345678901"] {
            assert_eq!(Amount::parse(text), Err(QuantityError::OutOfRange), "{text:?}");
        }
    }
}
