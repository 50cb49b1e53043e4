//! Civil-time helpers: RFC 3339 UTC timestamps to Unix nanoseconds and back, weekdays.

use inferwatch_core::civil::days_from_civil;

/// (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` (UTC, optional fractional seconds) into Unix nanoseconds.
pub fn parse_rfc3339_utc(text: &str) -> Result<u64, String> {
    let bad = || format!("invalid timestamp {text:?}: expected YYYY-MM-DDTHH:MM:SSZ (UTC)");
    let t = text.trim();
    let body = t.strip_suffix('Z').or_else(|| t.strip_suffix("+00:00")).ok_or_else(bad)?;
    let (date, time) = body.split_once(['T', ' ']).ok_or_else(bad)?;
    let mut dp = date.split('-');
    let y: i64 = dp.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let mo: u32 = dp.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let d: u32 = dp.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let mut tp = time.split(':');
    let h: u64 = tp.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let mi: u64 = tp.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let s: f64 = tp.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    if dp.next().is_some() || tp.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    if h > 23 || mi > 59 || !(0.0..60.0).contains(&s) || !(1970..=2200).contains(&y) {
        return Err(bad());
    }
    let days = days_from_civil(y, mo, d);
    if civil_from_days(days) != (y, mo, d) {
        return Err(bad());
    }
    let secs = days as u64 * 86_400 + h * 3600 + mi * 60;
    Ok(secs * 1_000_000_000 + (s * 1e9).round() as u64)
}

/// Formats Unix nanoseconds as `YYYY-MM-DDTHH:MM:SSZ` (whole seconds).
pub fn format_rfc3339_utc(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Day of the week of a Unix time: 0 = Monday … 6 = Sunday.
pub fn weekday(unix_ns: u64) -> u32 {
    let days = unix_ns / 1_000_000_000 / 86_400;
    ((days + 3) % 7) as u32 // 1970-01-01 was a Thursday
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_weekday() {
        let t = parse_rfc3339_utc("2026-01-05T00:00:00Z").unwrap();
        assert_eq!(t, 1_767_571_200 * 1_000_000_000);
        assert_eq!(format_rfc3339_utc(t), "2026-01-05T00:00:00Z");
        assert_eq!(weekday(t), 0); // a Monday
        assert_eq!(weekday(t + 5 * 86_400 * 1_000_000_000), 5); // Saturday
        assert!(parse_rfc3339_utc("2026-02-30T00:00:00Z").is_err());
        assert!(parse_rfc3339_utc("2026-01-05 00:00:00").is_err());
        assert_eq!(parse_rfc3339_utc("2026-01-05T12:30:15.5Z").unwrap() - t, 45_015_500_000_000);
    }
}
