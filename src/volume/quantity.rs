//! Resource quantities (`500m`, `64Mi`, `1e3`) as exact numbers, for the
//! downward API's `resourceFieldRef` and tmpfs sizes: the parts of apimachinery's
//! `resource.Quantity` the volume plugins need (`MilliValue`, `Value`, both
//! rounding up).

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;

/// A quantity that does not parse; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct Invalid(pub String);

/// A parsed quantity, held exactly in nano-units (1 = 10⁻⁹ of the unit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(i128);

impl Quantity {
    /// The quantity of `value` whole units.
    #[must_use]
    pub fn from_units(value: i64) -> Self {
        Self(i128::from(value) * NANO)
    }

    /// Parses the Kubernetes quantity syntax: a signed decimal number followed by
    /// a binary suffix (`Ki` … `Ei`), a decimal suffix (`n`, `u`, `m`, `k`, `M`,
    /// `G`, `T`, `P`, `E`) or an exponent (`e3`, `E-2`).
    ///
    /// # Errors
    /// [`Invalid`] for anything else, or a value too large to hold.
    pub fn parse(text: &str) -> Result<Self, Invalid> {
        let bad = || Invalid(text.to_string());
        let s = text.trim();
        let (negative, s) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad());
        }
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        // The number as digits / 10^frac.len().
        let digits: i128 = format!("{whole}{frac}").parse().map_err(|_| bad())?;
        let frac_digits = u32::try_from(frac.len()).map_err(|_| bad())?;
        // (multiplier numerator, power of ten) of the suffix.
        let (mul, pow10): (i128, i32) = match suffix {
            "" => (1, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            e if e.starts_with(['e', 'E']) => (1, e[1..].parse::<i32>().map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        // value in nano-units = digits * mul * 10^(pow10 + 9 - frac_digits)
        let exp = pow10 + 9 - i32::try_from(frac_digits).map_err(|_| bad())?;
        let base = digits.checked_mul(mul).ok_or_else(bad)?;
        let nanos = if exp >= 0 {
            let scale = 10i128.checked_pow(exp.unsigned_abs()).ok_or_else(bad)?;
            base.checked_mul(scale).ok_or_else(bad)?
        } else {
            // Finer than a nano-unit: round up, as Quantity does.
            let scale = 10i128.checked_pow(exp.unsigned_abs()).ok_or_else(bad)?;
            (base + scale - 1) / scale
        };
        Ok(Self(if negative { -nanos } else { nanos }))
    }

    /// The value in thousandths of a unit, rounded up (`MilliValue`).
    #[must_use]
    pub fn milli_value(self) -> i128 {
        div_ceil(self.0, NANO / 1000)
    }

    /// The value in units, rounded up (`Value`).
    #[must_use]
    pub fn value(self) -> i128 {
        div_ceil(self.0, NANO)
    }

    /// True for zero.
    #[must_use]
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

fn div_ceil(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && (a > 0) == (b > 0) {
        q + 1
    } else {
        q
    }
}

/// `ceil(a / b)` for the downward API's divisor arithmetic; 0 when `b` is 0.
#[must_use]
pub fn ceil_div(a: i128, b: i128) -> i128 {
    if b == 0 { 0 } else { div_ceil(a, b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_exactly() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(q("2").value(), 2);
        assert_eq!(q("500m").milli_value(), 500);
        assert_eq!(q("0.5").milli_value(), 500);
        assert_eq!(q("1.5Gi").value(), 3 << 29);
        assert_eq!(q("64Mi").value(), 64 << 20);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("1E-3").milli_value(), 1);
        assert_eq!(q("1Ei").value(), 1 << 60);
        assert_eq!(q("1n").milli_value(), 1, "rounds up");
        assert_eq!(q("1500m").value(), 2, "rounds up");
        assert_eq!(q("-1").value(), -1);
        for bad in ["", "m", "1.2.3", "1Qi", "abc", "1e"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }
}
