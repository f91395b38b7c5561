//! transformers' `strftime_now(format)`: the current date and time as
//! Python's `datetime.now().strftime(format)` writes it (Llama 3.x and
//! Granite templates put today's date into the system prompt).
//!
//! The clock is read in UTC: a server's prompts should not depend on the
//! host's time zone (Python uses local time, the same thing on a UTC host).

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A UTC calendar time, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    /// 0 = Monday
    weekday: u32,
    /// 1..=366
    yday: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl Utc {
    /// Now.
    pub fn now() -> Self {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Self::from_unix(secs)
    }

    /// The calendar time of a Unix timestamp (proleptic Gregorian calendar).
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Howard Hinnant's civil_from_days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
        Self {
            year,
            month,
            day,
            // 1970-01-01 was a Thursday.
            weekday: (days + 3).rem_euclid(7) as u32,
            yday,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    /// C `strftime` codes as glibc writes them in the C locale; codes it
    /// does not know are kept as written, as glibc does.
    pub fn format(&self, format: &str) -> String {
        let mut out = String::with_capacity(format.len() + 16);
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(code) = chars.next() else {
                out.push('%');
                break;
            };
            let day_name = DAYS[self.weekday as usize];
            let month_name = MONTHS[self.month as usize - 1];
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match code {
                'a' => out.push_str(&day_name[..3]),
                'A' => out.push_str(day_name),
                'b' | 'h' => out.push_str(&month_name[..3]),
                'B' => out.push_str(month_name),
                'd' => out.push_str(&format!("{:02}", self.day)),
                'e' => out.push_str(&format!("{:>2}", self.day)),
                'm' => out.push_str(&format!("{:02}", self.month)),
                'y' => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                'Y' => out.push_str(&self.year.to_string()),
                'H' => out.push_str(&format!("{:02}", self.hour)),
                'I' => out.push_str(&format!("{hour12:02}")),
                'M' => out.push_str(&format!("{:02}", self.minute)),
                'S' => out.push_str(&format!("{:02}", self.second)),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'j' => out.push_str(&format!("{:03}", self.yday)),
                'F' => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                // A naive datetime has no zone: Python writes nothing.
                'Z' | 'z' => {}
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    out.push(other);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates_as_python_does() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = Utc::from_unix(1_709_211_909);
        assert_eq!(
            t.format("%d %b %Y|%B %d, %Y|%A %a %j %I%p %H:%M:%S %y %m %%|%Q"),
            "29 Feb 2024|February 29, 2024|Thursday Thu 060 01PM 13:05:09 24 02 %|%Q"
        );
        let epoch = Utc::from_unix(0);
        assert_eq!(epoch.format("%Y-%m-%d %A %j"), "1970-01-01 Thursday 001");
        // Before the epoch: 1969-12-31 23:59:59, a Wednesday.
        assert_eq!(
            Utc::from_unix(-1).format("%F %H:%M:%S %a"),
            "1969-12-31 23:59:59 Wed"
        );
    }
}
