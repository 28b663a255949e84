//! Cron schedules: reading a job type's declared expression in its time
//! zone, and the ticks it names. Which tick the fleet has enqueued is the
//! database's to say (`store::schedule`); this module only does the
//! calendar arithmetic.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::CronParser;

use crate::types::ScheduleConfig;

/// The most missed ticks a schedule may ask to enqueue after an outage.
pub const MAX_BACKFILL: u32 = 1_000;

/// A parsed schedule: the expression and the zone it is read in.
#[derive(Debug, Clone)]
pub struct Calendar {
    cron: Cron,
    zone: Tz,
}

impl Calendar {
    /// Parses a schedule's expression and zone.
    ///
    /// # Errors
    /// Which of the two is wrong, and why.
    pub fn new(config: &ScheduleConfig) -> Result<Self, String> {
        // The parser's default takes seconds as an optional sixth field, first.
        let cron = CronParser::new()
            .parse(&config.cron)
            .map_err(|e| format!("{:?} is not a cron expression: {e}", config.cron))?;
        let zone = config
            .time_zone
            .parse::<Tz>()
            .map_err(|_| format!("{:?} is not an IANA time zone such as \"Europe/Berlin\"", config.time_zone))?;
        Ok(Calendar { cron, zone })
    }

    /// The first tick strictly after `after`, if the expression names any.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = whole_second(after).with_timezone(&self.zone);
        self.cron.find_next_occurrence(&local, false).ok().map(|t| t.with_timezone(&Utc))
    }

    /// The latest tick at or before `at`, if any.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = whole_second(at).with_timezone(&self.zone);
        self.cron.find_previous_occurrence(&local, true).ok().map(|t| t.with_timezone(&Utc))
    }
}

/// `at` without its fraction of a second: ticks fall on whole seconds, and
/// the parser keeps a fraction it is given.
fn whole_second(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(at.timestamp(), 0).unwrap_or(at)
}

/// Checks a schedule as a component declared it.
///
/// # Errors
/// The reason, naming the bad part.
pub fn check(config: &ScheduleConfig) -> Result<(), String> {
    Calendar::new(config)?;
    if config.backfill > MAX_BACKFILL {
        return Err(format!("backfill {} is more than the most allowed, {MAX_BACKFILL}", config.backfill));
    }
    if config.payload.contains_key(TICK_FIELD) {
        return Err(format!("the payload may not have a {TICK_FIELD:?} field: the host adds it"));
    }
    Ok(())
}

/// The payload field in which the host gives a scheduled job its tick.
pub const TICK_FIELD: &str = "_tick";

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn reads_five_and_six_fields() {
        let every_5_minutes = Calendar::new(&ScheduleConfig::new("*/5 * * * *")).unwrap();
        assert_eq!(every_5_minutes.next_after(at("2026-01-01T00:00:00Z")), Some(at("2026-01-01T00:05:00Z")));
        let every_second = Calendar::new(&ScheduleConfig::new("* * * * * *")).unwrap();
        assert_eq!(every_second.next_after(at("2026-01-01T00:00:00Z")), Some(at("2026-01-01T00:00:01Z")));
        assert_eq!(every_second.latest_at_or_before(at("2026-01-01T00:00:00.5Z")), Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(every_second.next_after(at("2026-01-01T00:00:00.5Z")), Some(at("2026-01-01T00:00:01Z")));
    }

    #[test]
    fn follows_the_zone_through_daylight_saving() {
        let config = ScheduleConfig { time_zone: "Europe/Berlin".into(), ..ScheduleConfig::new("0 9 * * *") };
        let berlin_nine = Calendar::new(&config).unwrap();
        // 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer.
        assert_eq!(berlin_nine.next_after(at("2026-01-10T12:00:00Z")), Some(at("2026-01-11T08:00:00Z")));
        assert_eq!(berlin_nine.next_after(at("2026-07-10T12:00:00Z")), Some(at("2026-07-11T07:00:00Z")));
    }

    #[test]
    fn refuses_bad_parts_by_name() {
        assert!(check(&ScheduleConfig::new("61 * * * *")).unwrap_err().contains("cron"));
        let zone = ScheduleConfig { time_zone: "Mars/Olympus".into(), ..ScheduleConfig::new("* * * * *") };
        assert!(check(&zone).unwrap_err().contains("time zone"));
        let backfill = ScheduleConfig { backfill: MAX_BACKFILL + 1, ..ScheduleConfig::new("* * * * *") };
        assert!(check(&backfill).unwrap_err().contains("backfill"));
        let mut tick = ScheduleConfig::new("* * * * *");
        tick.payload.insert(TICK_FIELD.into(), serde_json::json!(1));
        assert!(check(&tick).unwrap_err().contains("_tick"));
    }
}
