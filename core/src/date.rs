//! Dates for people, without a date library.

/// `secs` after the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian calendar):
/// how errors and reports print a moment (a certificate's expiry, a report's date) without a
/// date library.
pub fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_timestamp(1_704_153_600), "2024-01-02 00:00:00 UTC");
        assert_eq!(utc_timestamp(951_782_400 + 3_661), "2000-02-29 01:01:01 UTC");
        assert_eq!(utc_timestamp(4_107_542_399), "2100-02-28 23:59:59 UTC");
    }
}
