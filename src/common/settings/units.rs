//! Strict parsing of sizes and fractions (SPEC "Sizes and fractions").
//!
//! Used for memory limits (`GPUSHIM_MEMORY_LIMIT`, `GPUSHIM_MEMORY_LIMIT_<i>`, their
//! `CUDA_DEVICE_MEMORY_LIMIT` aliases and the config file's `memory_limit`/`[memory_limits]`)
//! through [`parse_limit`], and for virtual device sizes through [`parse_size`].
//!
//! # Grammar
//!
//! Leading and trailing whitespace is ignored; letters are case-insensitive.
//!
//! ```text
//! value    = "unlimited" | number [ws] unit | number [ws] "%" | number
//! number   = digits [ "." digits ]            (ASCII digits only; no sign, no exponent)
//! unit     = "b"                              (bytes)
//!          | "k" | "ki" | "kib"  …  "t" | "ti" | "tib"    (powers of 1024)
//!          | "kb" | "mb" | "gb" | "tb"                    (powers of 1000)
//! ```
//!
//! * No unit (or `B`): bytes, and the number must then be whole. `0` is zero bytes.
//! * With a unit, decimals are fine (`1.5GiB`, `0.5G` = 512 MiB); the result is computed exactly
//!   from the decimal digits and rounded down to whole bytes.
//! * `NN%` with 0 < NN ≤ 100 (decimals allowed) is a fraction of the device's physical memory.
//! * A bare number written with a point is a fraction in (0, 1]: `0.4`, `1.0`. `1.5` is an error
//!   (not 1.5 bytes), `0.0` is an error (write `0` for zero bytes).
//! * `unlimited`: no limit.
//!
//! Decisions where the SPEC is silent:
//!
//! * Leading zeros are decimal, never octal: `08G` is 8 GiB, `08` is 8 bytes.
//! * Whitespace is allowed between the number and its unit (`4 GiB`, `40 %`), nowhere else:
//!   `4 096`, `4 G iB` and `4 gigs` are errors.
//! * A number needs digits on both sides of its point: `.5` and `5.` are errors (write `0.5`).
//! * `B` alone means bytes (`4096B`); `PB`, `EiB`, … are not units.
//! * `1e9`, `0x10`, `-1`, `+1`, `nan`, `inf`: errors. A size past 2^64 − 1 bytes is an error,
//!   never a wrapped value.
//!
//! Nothing here panics, whatever the input.

use std::fmt;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// A memory limit as configured, before it meets a device.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Limit {
    /// No limit: the device's physical memory.
    #[default]
    Unlimited,
    /// An absolute number of bytes.
    Bytes(u64),
    /// A share of the device's physical total memory, in (0, 1].
    Fraction(f64),
}

impl Limit {
    /// The effective limit of a device with `physical_total` bytes: min(limit, physical).
    /// `Unlimited` is the physical total; a fraction is floor(f × total).
    pub fn resolve(&self, physical_total: u64) -> u64 {
        match *self {
            Limit::Unlimited => physical_total,
            Limit::Bytes(b) => b.min(physical_total),
            Limit::Fraction(f) => fraction_of(f, physical_total),
        }
    }
}

/// floor(f × total), robust to binary floating point: a product within a few ulps of a whole
/// number is taken as that number, so `0.3` of 10 bytes is 3, not 2. Exact for fractions
/// written with up to ~15 significant digits, which is every fraction a person writes.
fn fraction_of(f: f64, total: u64) -> u64 {
    if f.is_nan() || f <= 0.0 {
        return 0;
    }
    if f >= 1.0 {
        return total;
    }
    let exact = f * total as f64;
    let nearest = exact.round();
    let value = if (exact - nearest).abs() <= exact * 4.0 * f64::EPSILON {
        nearest
    } else {
        exact.floor()
    };
    // `as` saturates (never undefined) for out-of-range floats.
    (value as u64).min(total)
}

impl fmt::Display for Limit {
    /// `unlimited`, `40%`, or a size that [`parse_limit`] reads back to the same bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::Bytes(b) => f.write_str(&format_size(b)),
            Limit::Fraction(x) => write!(f, "{}%", x * 100.0),
        }
    }
}

/// A size written the shortest exact way: `8GiB`, `1536MiB`, `1000` (bytes).
/// [`parse_size`] reads it back to the same number.
pub fn format_size(bytes: u64) -> String {
    let units = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    for (mult, name) in units {
        if bytes != 0 && bytes.checked_rem(mult) == Some(0) {
            return format!("{}{}", bytes / mult, name);
        }
    }
    bytes.to_string()
}

/// Why a size or fraction was refused. `Display` gives the message shown to the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitError {
    /// Empty or whitespace only.
    Empty { fraction_allowed: bool },
    /// Not a number with a known unit (`4 gigs`, `-1`, `08x`, `1e9`, `nan`, …).
    Malformed { fraction_allowed: bool },
    /// `.5`, `5.`, `1..5`: digits are needed on both sides of the point.
    BadNumber,
    /// `1.5B`, or a bare `1.5` where only a size is allowed.
    WholeBytes,
    /// A bare decimal above 1, e.g. `1.5`.
    FractionAboveOne,
    /// `0.0`, `0.00`.
    FractionZero,
    /// `0%`, `101%`.
    PercentOutOfRange,
    /// More than 2^64 − 1 bytes.
    Overflow,
    /// A fraction (`40%`, `0.4`) where only a size is allowed.
    FractionNotAllowed,
    /// `unlimited` where only a size is allowed.
    UnlimitedNotAllowed,
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = match *self {
            UnitError::Empty {
                fraction_allowed: true,
            } => "the value is empty; expected a size like 4GiB or a fraction like 40%",
            UnitError::Empty {
                fraction_allowed: false,
            } => "the value is empty; expected a size like 4GiB",
            UnitError::Malformed {
                fraction_allowed: true,
            } => "expected a size like 4GiB or a fraction like 40%",
            UnitError::Malformed {
                fraction_allowed: false,
            } => "expected a size like 4GiB",
            UnitError::BadNumber => {
                "a number needs digits on both sides of its point, like 0.5 or 1.5GiB"
            }
            UnitError::WholeBytes => {
                "a number of bytes must be whole; for part of a unit write the unit, like 1.5GiB"
            }
            UnitError::FractionAboveOne => {
                "a bare decimal is a fraction of the device's memory and must be at most 1 \
                 (like 0.4 or 40%); for a size write the unit, like 1.5GiB"
            }
            UnitError::FractionZero => {
                "a fraction must be above 0; write 0 for a limit of zero bytes"
            }
            UnitError::PercentOutOfRange => "a percentage must be above 0% and at most 100%",
            UnitError::Overflow => {
                "too large: a size can be at most 18446744073709551615 bytes (16 EiB)"
            }
            UnitError::FractionNotAllowed => {
                "a fraction is not allowed here; expected a size like 4GiB"
            }
            UnitError::UnlimitedNotAllowed => {
                "\"unlimited\" is not allowed here; expected a size like 4GiB"
            }
        };
        f.write_str(msg)
    }
}

impl std::error::Error for UnitError {}

/// Parses a memory limit: a size, a fraction or `unlimited`.
pub fn parse_limit(s: &str) -> Result<Limit, UnitError> {
    parse_value(s, true)
}

/// Parses a size in bytes (no fractions, no `unlimited`), e.g. for virtual device sizes.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    match parse_value(s, false)? {
        Limit::Bytes(b) => Ok(b),
        Limit::Fraction(_) => Err(UnitError::FractionNotAllowed),
        Limit::Unlimited => Err(UnitError::UnlimitedNotAllowed),
    }
}

/// A validated decimal number: `int` and `frac` are non-empty runs of ASCII digits
/// (`frac` empty when the number has no point).
#[derive(Debug, Clone, Copy)]
struct Decimal<'a> {
    int: &'a str,
    frac: &'a str,
    has_point: bool,
}

impl<'a> Decimal<'a> {
    /// `digits [ "." digits ]`, or an error saying what is wrong.
    fn parse(s: &'a str, fraction_allowed: bool) -> Result<Self, UnitError> {
        let (int, frac, has_point) = match s.split_once('.') {
            Some((i, f)) => (i, f, true),
            None => (s, "", false),
        };
        if int.is_empty() && !has_point {
            return Err(UnitError::Malformed { fraction_allowed });
        }
        let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(int) || !all_digits(frac) {
            // Only digits and points reach here, so a second point is the problem.
            return Err(UnitError::BadNumber);
        }
        if int.is_empty() || (has_point && frac.is_empty()) {
            return Err(UnitError::BadNumber);
        }
        Ok(Decimal {
            int,
            frac,
            has_point,
        })
    }

    /// The integer part, or `None` past u64.
    fn int_value(&self) -> Option<u64> {
        self.int.bytes().try_fold(0u64, |acc, b| {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })
    }

    fn frac_is_zero(&self) -> bool {
        self.frac.bytes().all(|b| b == b'0')
    }

    fn is_zero(&self) -> bool {
        self.int_value() == Some(0) && self.frac_is_zero()
    }

    /// True when the number is at most `n`, compared exactly on the digits.
    fn at_most(&self, n: u64) -> bool {
        match self.int_value() {
            Some(i) if i < n => true,
            Some(i) if i == n => self.frac_is_zero(),
            _ => false,
        }
    }

    /// floor(number × mult), exactly, or `None` past u64.
    fn times(&self, mult: u64) -> Option<u64> {
        let whole = self.int_value()?.checked_mul(mult)?;
        whole.checked_add(floor_frac_times(self.frac, mult))
    }

    /// The number × 10^`exp` as the nearest float (parsed from the decimal text, so `40%` is
    /// exactly the float `0.4`). The grammar is already checked, so this cannot fail in practice.
    fn to_f64(self, exp: i32, fraction_allowed: bool) -> Result<f64, UnitError> {
        let frac = if self.frac.is_empty() { "0" } else { self.frac };
        let text = format!("{}.{}e{}", self.int, frac, exp);
        text.parse::<f64>()
            .map_err(|_| UnitError::Malformed { fraction_allowed })
    }
}

/// floor(0.frac × mult) computed digit by digit from the last digit, so any number of
/// fractional digits is exact and nothing overflows: each step keeps the running value
/// below `mult`, and floor((floor(a) + n) / 10) = floor((a + n) / 10) for whole n.
fn floor_frac_times(frac: &str, mult: u64) -> u64 {
    let mult = u128::from(mult);
    let mut acc: u128 = 0;
    for b in frac.bytes().rev() {
        acc = (acc + u128::from(b.saturating_sub(b'0')) * mult) / 10;
    }
    u64::try_from(acc).unwrap_or(u64::MAX)
}

/// Bytes per unit, for a unit already lower-cased. `None`: not a unit.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let m = match unit {
        "b" => 1,
        "k" | "ki" | "kib" => KIB,
        "m" | "mi" | "mib" => MIB,
        "g" | "gi" | "gib" => GIB,
        "t" | "ti" | "tib" => TIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    Some(m)
}

fn parse_value(s: &str, fraction_allowed: bool) -> Result<Limit, UnitError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(UnitError::Empty { fraction_allowed });
    }
    if t.eq_ignore_ascii_case("unlimited") {
        return Ok(Limit::Unlimited);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, rest) = t.split_at(split);
    let num = Decimal::parse(num, fraction_allowed)?;
    let unit = rest.trim_start().to_ascii_lowercase();
    match unit.as_str() {
        "" if num.has_point => bare_fraction(&num, fraction_allowed),
        "" => num.int_value().map(Limit::Bytes).ok_or(UnitError::Overflow),
        "%" => percent(&num, fraction_allowed),
        "b" if num.has_point => Err(UnitError::WholeBytes),
        u => {
            let mult = unit_multiplier(u).ok_or(UnitError::Malformed { fraction_allowed })?;
            num.times(mult).map(Limit::Bytes).ok_or(UnitError::Overflow)
        }
    }
}

fn bare_fraction(num: &Decimal<'_>, fraction_allowed: bool) -> Result<Limit, UnitError> {
    if !fraction_allowed {
        return Err(UnitError::WholeBytes);
    }
    if num.is_zero() {
        return Err(UnitError::FractionZero);
    }
    if !num.at_most(1) {
        return Err(UnitError::FractionAboveOne);
    }
    num.to_f64(0, fraction_allowed).map(Limit::Fraction)
}

fn percent(num: &Decimal<'_>, fraction_allowed: bool) -> Result<Limit, UnitError> {
    if !fraction_allowed {
        return Err(UnitError::FractionNotAllowed);
    }
    if num.is_zero() || !num.at_most(100) {
        return Err(UnitError::PercentOutOfRange);
    }
    let f = num.to_f64(-2, fraction_allowed)?;
    Ok(Limit::Fraction(f.min(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC_MSG: &str = "expected a size like 4GiB or a fraction like 40%";

    fn bytes(s: &str) -> u64 {
        match parse_limit(s) {
            Ok(Limit::Bytes(b)) => b,
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    fn frac(s: &str) -> f64 {
        match parse_limit(s) {
            Ok(Limit::Fraction(f)) => f,
            other => panic!("{s:?} gave {other:?}"),
        }
    }

    fn err(s: &str) -> UnitError {
        match parse_limit(s) {
            Err(e) => e,
            Ok(v) => panic!("{s:?} was accepted as {v:?}"),
        }
    }

    #[test]
    fn plain_bytes() {
        assert_eq!(bytes("0"), 0);
        assert_eq!(bytes("00"), 0);
        assert_eq!(bytes("1"), 1);
        assert_eq!(bytes("4096"), 4096);
        assert_eq!(bytes("08"), 8);
        assert_eq!(bytes("  4096 \t"), 4096);
        assert_eq!(bytes("18446744073709551615"), u64::MAX);
        assert_eq!(bytes("4096B"), 4096);
        assert_eq!(bytes("4096 b"), 4096);
    }

    #[test]
    fn binary_units_every_spelling() {
        for (unit, mult) in [("k", KIB), ("m", MIB), ("g", GIB), ("t", TIB)] {
            for suffix in ["", "i", "ib"] {
                let u = format!("{unit}{suffix}");
                assert_eq!(bytes(&format!("3{u}")), 3 * mult, "{u}");
                assert_eq!(bytes(&format!("3{}", u.to_uppercase())), 3 * mult, "{u}");
            }
        }
        assert_eq!(bytes("4GiB"), 4 * GIB);
        assert_eq!(bytes("4gib"), 4 * GIB);
        assert_eq!(bytes("4 GiB"), 4 * GIB);
        assert_eq!(bytes(" 4GiB "), 4 * GIB);
        assert_eq!(bytes("4Gi"), 4 * GIB);
    }

    #[test]
    fn decimal_units() {
        assert_eq!(bytes("1KB"), 1_000);
        assert_eq!(bytes("2mb"), 2_000_000);
        assert_eq!(bytes("4GB"), 4_000_000_000);
        assert_eq!(bytes("1TB"), 1_000_000_000_000);
        assert_eq!(bytes("1.5GB"), 1_500_000_000);
    }

    #[test]
    fn hami_core_spellings() {
        assert_eq!(bytes("4g"), 4 * GIB);
        assert_eq!(bytes("4096m"), 4096 * MIB);
        assert_eq!(bytes("4096M"), 4096 * MIB);
    }

    #[test]
    fn decimals_with_units_round_down() {
        assert_eq!(bytes("1.5GiB"), 3 * GIB / 2);
        assert_eq!(bytes("0.5G"), 512 * MIB);
        assert_eq!(bytes("08G"), 8 * GIB);
        assert_eq!(bytes("0.001k"), 1); // 1.024 bytes
        assert_eq!(bytes("0.0009k"), 0); // 0.9216 bytes
        assert_eq!(bytes("1.0000000000000000000000000000001k"), 1024);
        assert_eq!(bytes("0.99999999999999999999999999999k"), 1023);
        assert_eq!(bytes("0.1T"), TIB / 10);
    }

    #[test]
    fn fractions() {
        assert_eq!(frac("40%"), 0.4);
        assert_eq!(frac("40 %"), 0.4);
        assert_eq!(frac("100%"), 1.0);
        assert_eq!(frac("100.0%"), 1.0);
        assert_eq!(frac("12.5%"), 0.125);
        assert_eq!(frac("0.001%"), 0.00001);
        assert_eq!(frac("0.4"), 0.4);
        assert_eq!(frac("1.0"), 1.0);
        assert_eq!(frac("1.000"), 1.0);
        assert_eq!(frac(" 0.25 "), 0.25);
    }

    #[test]
    fn unlimited() {
        assert_eq!(parse_limit("unlimited"), Ok(Limit::Unlimited));
        assert_eq!(parse_limit(" UNLIMITED "), Ok(Limit::Unlimited));
        assert_eq!(parse_size("unlimited"), Err(UnitError::UnlimitedNotAllowed));
    }

    #[test]
    fn spec_rejects_with_the_spec_message() {
        for bad in [
            "4 gigs",
            "-1",
            "08x",
            "1e9",
            "nan",
            "inf",
            "0x10",
            "4 096",
            "4 G iB",
            "+1",
            "4PB",
            "abc",
            "4GiB4",
            "4%%",
            "%",
            "1,5G",
            "4 GiB extra",
            "４G",
            "--1",
        ] {
            let e = err(bad);
            assert_eq!(
                e,
                UnitError::Malformed {
                    fraction_allowed: true
                },
                "{bad:?}"
            );
            assert_eq!(e.to_string(), SPEC_MSG, "{bad:?}");
        }
        assert_eq!(err("4 gigs").to_string(), SPEC_MSG);
    }

    #[test]
    fn empty_is_an_error() {
        for bad in ["", " ", "\t\n"] {
            assert_eq!(
                err(bad),
                UnitError::Empty {
                    fraction_allowed: true
                },
                "{bad:?}"
            );
        }
        assert!(err("").to_string().contains(SPEC_MSG));
        assert_eq!(
            parse_size(""),
            Err(UnitError::Empty {
                fraction_allowed: false
            })
        );
    }

    #[test]
    fn range_errors() {
        assert_eq!(err("0%"), UnitError::PercentOutOfRange);
        assert_eq!(err("0.0%"), UnitError::PercentOutOfRange);
        assert_eq!(err("101%"), UnitError::PercentOutOfRange);
        assert_eq!(err("100.0001%"), UnitError::PercentOutOfRange);
        assert_eq!(
            err("99999999999999999999999%"),
            UnitError::PercentOutOfRange
        );
        assert_eq!(err("1.5"), UnitError::FractionAboveOne);
        assert_eq!(err("1.0000000000000000001"), UnitError::FractionAboveOne);
        assert_eq!(err("2.0"), UnitError::FractionAboveOne);
        assert_eq!(err("0.0"), UnitError::FractionZero);
        assert_eq!(err("0.000"), UnitError::FractionZero);
        assert_eq!(err("1.5B"), UnitError::WholeBytes);
    }

    #[test]
    fn malformed_numbers() {
        for bad in [
            ".5", "5.", "1..5", "1.2.3", ".", "..", ".5G", "5.G", "1.2.3%",
        ] {
            assert_eq!(err(bad), UnitError::BadNumber, "{bad:?}");
        }
    }

    #[test]
    fn overflow_is_an_error_never_a_wrap() {
        assert_eq!(err("18446744073709551616"), UnitError::Overflow);
        assert_eq!(err("99999999999999999999999999999"), UnitError::Overflow);
        assert_eq!(err("16777216TiB"), UnitError::Overflow); // 2^64
        assert_eq!(bytes("16777215TiB"), 16_777_215 * TIB);
        assert_eq!(err("17179869184GiB"), UnitError::Overflow);
        assert_eq!(err("18446744073709551615.5k"), UnitError::Overflow);
        assert_eq!(err("18446744073709551615.5B"), UnitError::WholeBytes);
    }

    #[test]
    fn parse_size_rules() {
        assert_eq!(parse_size("8GiB"), Ok(8 * GIB));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1.5G"), Ok(3 * GIB / 2));
        assert_eq!(parse_size("40%"), Err(UnitError::FractionNotAllowed));
        assert_eq!(parse_size("0.4"), Err(UnitError::WholeBytes));
        assert_eq!(parse_size("1.5"), Err(UnitError::WholeBytes));
        assert_eq!(
            parse_size("4 gigs"),
            Err(UnitError::Malformed {
                fraction_allowed: false
            })
        );
        assert_eq!(
            UnitError::Malformed {
                fraction_allowed: false
            }
            .to_string(),
            "expected a size like 4GiB"
        );
    }

    #[test]
    fn resolve() {
        let total = 80 * GIB;
        assert_eq!(Limit::Unlimited.resolve(total), total);
        assert_eq!(Limit::Bytes(4 * GIB).resolve(total), 4 * GIB);
        assert_eq!(Limit::Bytes(100 * GIB).resolve(total), total);
        assert_eq!(Limit::Bytes(0).resolve(total), 0);
        assert_eq!(Limit::Fraction(1.0).resolve(total), total);
        assert_eq!(Limit::Fraction(0.5).resolve(total), 40 * GIB);
        assert_eq!(Limit::Fraction(0.4).resolve(total), 32 * GIB);
        assert_eq!(Limit::Fraction(0.3).resolve(10), 3);
        assert_eq!(Limit::Fraction(0.7).resolve(10), 7);
        assert_eq!(Limit::Fraction(0.5).resolve(3), 1);
        assert_eq!(Limit::Fraction(0.5).resolve(0), 0);
        assert_eq!(Limit::Fraction(f64::NAN).resolve(10), 0);
        assert_eq!(Limit::Fraction(2.0).resolve(10), 10);
        assert_eq!(Limit::Fraction(1.0).resolve(u64::MAX), u64::MAX);
        let near_max = Limit::Fraction(0.999_999).resolve(u64::MAX);
        assert!(near_max < u64::MAX && near_max > u64::MAX / 10 * 9);
        assert_eq!(Limit::Fraction(-0.5).resolve(10), 0);
        assert_eq!(Limit::Fraction(f64::INFINITY).resolve(10), 10);
        // Every whole percentage of a typical device is exact.
        for total in [10u64, 1000, 24 * GIB, 80 * GIB, 81_559_306_240] {
            for pct in 1..=100u64 {
                let f = frac(&format!("{pct}%"));
                let want = (u128::from(total) * u128::from(pct) / 100) as u64;
                assert_eq!(Limit::Fraction(f).resolve(total), want, "{pct}% of {total}");
            }
        }
    }

    #[test]
    fn display_round_trips_sizes() {
        for b in [0, 1, 1000, 1024, 1536 * MIB, 8 * GIB, 3 * TIB, u64::MAX] {
            let shown = Limit::Bytes(b).to_string();
            assert_eq!(parse_limit(&shown), Ok(Limit::Bytes(b)), "{shown}");
        }
        assert_eq!(format_size(8 * GIB), "8GiB");
        assert_eq!(format_size(1536 * MIB), "1536MiB");
        assert_eq!(Limit::Unlimited.to_string(), "unlimited");
        assert_eq!(Limit::Fraction(0.5).to_string(), "50%");
    }

    #[test]
    fn never_panics_on_odd_input() {
        let mut odd: Vec<String> = [
            "\u{0}",
            "é",
            "1é",
            "1.é",
            "%%%",
            "1 %",
            "1\u{a0}GiB",
            "\u{feff}1",
            "1 \u{301}G",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        odd.push("9".repeat(5000));
        odd.push("1.".repeat(100));
        for s in &odd {
            let _ = parse_limit(s);
            let _ = parse_size(s);
        }
        let long_frac = format!("0.{}G", "9".repeat(10_000));
        assert_eq!(bytes(&long_frac), GIB - 1);
    }
}
