//! Container resources as the kubelet reads them for the downward API:
//! quantities (`500m`, `64Mi`, `1e3`) held exactly, with apimachinery's
//! `resource.Quantity` rounding (`MilliValue` and `Value` round up), and the
//! value of a `resourceFieldRef`, which environment variables and downwardAPI
//! volume files share as the kubelet's
//! `ExtractResourceValueByContainerNameAndNodeAllocatable` serves both.
//!
//! Elsewhere the agent parses quantities with `kube_quantity`; it offers
//! neither exact milli-values nor the rounding up these values need to match
//! the kubelet's digit for digit.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

/// True for an extended resource name (`example.com/dongle`): one with a
/// domain other than `kubernetes.io`, as the kubelet's
/// `v1helper.IsExtendedResourceName` (the API server validates the syntax).
#[must_use]
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;

/// A quantity that does not parse; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct Invalid(pub String);

/// Why text is not a quantity [`Quantity::parse`] holds.
#[derive(Clone, Copy)]
enum Unparsed {
    /// Not the quantity syntax.
    Syntax,
    /// A quantity beyond what an `i128` of nano-units holds.
    TooLarge {
        /// Its sign.
        negative: bool,
    },
}

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
    /// [`Invalid`] for anything else, or a value too large to hold (beyond
    /// about ±1.7 × 10²⁹ units).
    pub fn parse(text: &str) -> Result<Self, Invalid> {
        Self::parse_parts(text).map_err(|_| Invalid(text.to_string()))
    }

    /// Parses as [`Quantity::parse`], but a value too large to hold is the
    /// largest quantity of its sign instead of an error: for limits, where
    /// such a value means more than any node has (`1e30` cpu, `1e40` bytes).
    ///
    /// # Errors
    /// [`Invalid`] for text that is not a quantity.
    pub fn parse_saturating(text: &str) -> Result<Self, Invalid> {
        match Self::parse_parts(text) {
            Ok(q) => Ok(q),
            Err(Unparsed::TooLarge { negative }) => {
                Ok(Self(if negative { -i128::MAX } else { i128::MAX }))
            }
            Err(Unparsed::Syntax) => Err(Invalid(text.to_string())),
        }
    }

    /// The parser of [`Quantity::parse`], in checked arithmetic throughout
    /// (exponents and digit strings come from pod specs).
    fn parse_parts(text: &str) -> Result<Self, Unparsed> {
        let s = text.trim();
        let (negative, s) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        let too_large = Unparsed::TooLarge { negative };
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(Unparsed::Syntax);
        }
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        // Trailing zeros of the fraction change nothing.
        let frac = frac.trim_end_matches('0');
        // (multiplier numerator, power of ten) of the suffix.
        let (mul, pow10): (i128, i64) = match suffix {
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
            e if e.starts_with(['e', 'E']) => {
                (1, e[1..].parse::<i64>().map_err(|_| Unparsed::Syntax)?)
            }
            _ => return Err(Unparsed::Syntax),
        };
        let frac_digits = i64::try_from(frac.len()).map_err(|_| Unparsed::Syntax)?;
        // The number as digits / 10^frac_digits.
        let digits: i128 = match format!("{whole}{frac}").parse() {
            Ok(d) => d,
            // More digits than an i128 holds: too large when the whole part
            // alone is at least 10^39 nano-units; else more precision than
            // a nano-unit, which is not a quantity this parser keeps.
            Err(_) => {
                let whole_digits = i64::try_from(whole.trim_start_matches('0').len())
                    .map_err(|_| Unparsed::Syntax)?;
                let magnitude = whole_digits.saturating_add(pow10).saturating_add(9);
                return Err(if magnitude > 39 {
                    too_large
                } else {
                    Unparsed::Syntax
                });
            }
        };
        if digits == 0 {
            return Ok(Self(0));
        }
        // value in nano-units = digits * mul * 10^(pow10 + 9 - frac_digits)
        let exp = pow10.saturating_add(9).saturating_sub(frac_digits);
        let base = digits.checked_mul(mul).ok_or(too_large)?;
        let scale = u32::try_from(exp.unsigned_abs())
            .ok()
            .and_then(|e| 10i128.checked_pow(e));
        let nanos = if exp >= 0 {
            scale
                .and_then(|scale| base.checked_mul(scale))
                .ok_or(too_large)?
        } else {
            // Finer than a nano-unit: round up, as Quantity does (anything
            // below 10^-38 of a nano-unit is one).
            scale.map_or(1, |scale| base / scale + i128::from(base % scale != 0))
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

    /// `self + other`, held at the largest quantity of its sign on overflow.
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }

    /// `self - other`, held at the largest quantity of its sign on overflow.
    #[must_use]
    pub fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }
}

/// `ceil(a / b)`; 0 when `b` is 0 (a divisor that rounds to nothing).
fn div_ceil(a: i128, b: i128) -> i128 {
    if b == 0 {
        return 0;
    }
    let q = a / b;
    if a % b != 0 && (a > 0) == (b > 0) {
        q + 1
    } else {
        q
    }
}

/// Why a `resourceFieldRef` has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    /// The pod has no (init) container of that name.
    #[error("container {0} not found")]
    NoContainer(String),
    /// Not `limits.<resource>` or `requests.<resource>` of cpu, memory,
    /// ephemeral-storage or hugepages-*.
    #[error("unsupported container resource: {0}")]
    Unsupported(String),
    /// A quantity (the value or the divisor) does not parse.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

fn parse(q: Option<&ApiQuantity>) -> Result<Quantity, Invalid> {
    q.map_or(Ok(Quantity::default()), |q| Quantity::parse(&q.0))
}

/// The value of `resource` (`limits.cpu`, `requests.memory`, …) of the
/// container or init container named `container`, as the kubelet's
/// `ExtractResourceValueByContainerNameAndNodeAllocatable`: a limit the
/// container does not set is the node's `allocatable` amount, a request it
/// does not set is 0; cpu is `ceil(millicores / divisor millicores)`, memory,
/// ephemeral-storage and hugepages `ceil(bytes / divisor bytes)`; the divisor
/// defaults to 1 (also when 0).
///
/// # Errors
/// [`RefError`] for an unknown container or resource, or a bad quantity.
pub fn container_resource_value(
    pod: &Pod,
    container: &str,
    resource: &str,
    divisor: Option<&ApiQuantity>,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<String, RefError> {
    let unsupported = || RefError::Unsupported(resource.to_string());
    let c = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == container)
        .ok_or_else(|| RefError::NoContainer(container.to_string()))?;
    let divisor = parse(divisor)?;
    let divisor = if divisor.is_zero() {
        Quantity::from_units(1)
    } else {
        divisor
    };
    let (kind, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let resources = c.resources.as_ref();
    let value = match kind {
        "limits" => resources
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(name))
            .or_else(|| allocatable.get(name)),
        "requests" => resources
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(name)),
        _ => return Err(unsupported()),
    };
    let value = parse(value)?;
    let out = match name {
        "cpu" => div_ceil(value.milli_value(), divisor.milli_value()),
        "memory" | "ephemeral-storage" => div_ceil(value.value(), divisor.value()),
        r if r.starts_with("hugepages-") => div_ceil(value.value(), divisor.value()),
        _ => return Err(unsupported()),
    };
    Ok(out.to_string())
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

    #[test]
    fn extreme_quantities_never_overflow() {
        let big = "170141183460469231731687303715884105727"; // i128::MAX
        // (text, value in units by `parse`: None = an error)
        let cases = [
            ("9223372036854775807", Some(i128::from(i64::MAX))),
            ("-9223372036854775808", Some(i128::from(i64::MIN))),
            ("8Ei", Some(1 << 63)),
            ("9e15", Some(9_000_000_000_000_000)),
            ("1e29", Some(10i128.pow(29))),
            ("1e30", None),
            ("1e2147483647", None),
            ("1e9223372036854775807", None),
            ("1e99999999999999999999", None),
            (&format!("{big}e-20"), Some(1_701_411_834_604_692_318)),
            (&format!("{big}{big}"), None),
            ("0e2147483647", Some(0)),
            ("1e-2147483648", Some(1)),
            ("1e-9223372036854775808", Some(1)),
            (&format!("0.{}1", "0".repeat(60)), Some(1)),
            (&format!("1.{}", "0".repeat(60)), Some(1)),
        ];
        for (text, want) in cases {
            let got = Quantity::parse(text).ok().map(Quantity::value);
            assert_eq!(got, want, "{text}");
        }
        // Too large to hold: the largest quantity of its sign when saturating.
        let max = Quantity(i128::MAX);
        let min = Quantity(-i128::MAX);
        for (text, want) in [
            ("1e30", max),
            ("1e2147483647", max),
            ("-1e2147483647", min),
            (&format!("{big}{big}"), max),
            (&format!("-{big}{big}"), min),
        ] {
            assert_eq!(Quantity::parse_saturating(text), Ok(want), "{text}");
        }
        assert_eq!(max.milli_value(), i128::MAX / 1_000_000 + 1);
        assert_eq!(min.value(), -(i128::MAX / NANO));
        assert!(Quantity::parse_saturating("1e").is_err());
        assert!(Quantity::parse_saturating(&format!("0.{big}{big}")).is_err());
    }

    #[test]
    fn container_resource_values_as_the_kubelet_extracts_them() {
        use crate::fixtures::pod;
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let q = |s: &str| ApiQuantity(s.into());
        let mut p = pod("web").container("c", "busybox").build();
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("memory".to_string(), q("64Mi")),
                ("hugepages-2Mi".to_string(), q("4Mi")),
            ])),
            requests: Some(BTreeMap::from([("cpu".to_string(), q("250m"))])),
            ..Default::default()
        });
        let mut init = spec.containers[0].clone();
        init.name = "init".into();
        spec.init_containers = Some(vec![init]);
        let allocatable = BTreeMap::from([
            ("cpu".to_string(), q("2")),
            ("ephemeral-storage".to_string(), q("10G")),
        ]);
        let value = |c: &str, res: &str, div: Option<&str>| {
            container_resource_value(&p, c, res, div.map(q).as_ref(), &allocatable)
        };
        let ok = |v: &str| Ok(v.to_string());
        assert_eq!(value("c", "requests.cpu", None), ok("1"), "rounds up");
        assert_eq!(value("c", "requests.cpu", Some("1m")), ok("250"));
        assert_eq!(value("c", "requests.cpu", Some("0")), ok("1"), "0 is 1");
        assert_eq!(value("c", "limits.cpu", None), ok("2"), "allocatable");
        assert_eq!(value("c", "requests.memory", None), ok("0"), "unset");
        assert_eq!(value("c", "limits.memory", Some("1Mi")), ok("64"));
        assert_eq!(value("c", "limits.memory", Some("1M")), ok("68"));
        assert_eq!(value("c", "limits.hugepages-2Mi", Some("2Mi")), ok("2"));
        assert_eq!(
            value("c", "limits.ephemeral-storage", Some("1Gi")),
            ok("10")
        );
        assert_eq!(value("init", "limits.memory", None), ok("67108864"));
        assert_eq!(value("c", "limits.cpu", Some("-1n")), ok("0"));
        assert_eq!(
            value("nope", "limits.cpu", None),
            Err(RefError::NoContainer("nope".into()))
        );
        for bad in ["limits.gpu", "cpu", "status.cpu"] {
            assert_eq!(
                value("c", bad, None),
                Err(RefError::Unsupported(bad.into())),
                "{bad}"
            );
        }
        assert!(matches!(
            value("c", "limits.cpu", Some("x")),
            Err(RefError::Invalid(_))
        ));
    }
}
