//! Cron schedules: reading a job type's declared expression in its time
//! zone, the ticks it names, and which of them a look at the schedule
//! enqueues. Which tick the fleet has enqueued is the database's to say
//! ([`crate::store::schedule`]); this module only does the calendar
//! arithmetic, so all of it is pure and tested here.
//!
//! A tick is an instant. An expression names wall-clock times in its zone,
//! and around a daylight-saving change a wall-clock time may stand for no
//! instant or for two (croner's rules, which every direction here follows):
//! - when the clocks spring forward, an interval expression (`*/15 * * * *`)
//!   has no tick in the skipped hour; a fixed-time one (`30 2 * * *`: one
//!   second, minute and hour) ticks once, at the first instant after the gap;
//! - when the clocks fall back, an interval expression ticks in both passes
//!   through the repeated hour; a fixed-time one ticks once, in the first.
//!
//! Ticks are ordered by the instant, never by the wall clock, so walking
//! forward ([`Calendar::next_after`]) and backward
//! ([`Calendar::previous_before`]) give the same ticks in opposite orders,
//! through any change of the clocks.

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::parser::CronParser;
use croner::{Cron, JobType};

use crate::types::ScheduleConfig;

/// The most missed ticks a schedule may ask to enqueue after an outage.
pub const MAX_BACKFILL: u32 = 1_000;

/// The payload field in which the host gives a scheduled job its tick.
pub const TICK_FIELD: &str = "_tick";

/// Longer than any single change of a zone's UTC offset (daylight saving
/// moves clocks by an hour, two at most anywhere): wall-clock order and the
/// order of instants disagree only this close to a change.
const NEAR_CHANGE: TimeDelta = TimeDelta::hours(3);

/// The most wall-clock times one step looks at before it gives up: far more
/// than any real expression needs (an every-second one across a skipped
/// hour looks at 3,600), so only an expression that never matches ends here.
const MAX_STEPS: u32 = 100_000;

/// A parsed schedule: the expression and the zone it is read in.
#[derive(Debug, Clone)]
pub struct Calendar {
    cron: Cron,
    zone: Tz,
    /// One second, minute and hour: ticks once a day at most, even when the
    /// clocks fall back through its time or spring forward over it.
    fixed: bool,
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
        let fixed = cron.determine_job_type() == JobType::FixedTime;
        Ok(Calendar { cron, zone, fixed })
    }

    /// The first tick strictly after `after`, if the expression names any.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Wall-clock times after `after`'s own, in order. Each one's first
        // instant comes later than every instant of the ones before it, so
        // the first whose first instant is after `after` ends the walk; a
        // repeated time may have only its second instant after `after`,
        // which the walk keeps and goes on past.
        let mut wall = self.wall(after);
        let mut best = None;
        for _ in 0..MAX_STEPS {
            let Some(next) = self.wall_next(wall, false) else { break };
            wall = next;
            let instants = self.instants(wall);
            best = earliest(best, instants.iter().copied().find(|tick| *tick > after));
            if instants.first().is_some_and(|tick| *tick > after) {
                break;
            }
        }
        // The second pass through a repeated hour comes after the first
        // pass's later wall-clock times, which may be before `after`'s own.
        earliest(best, self.second_pass_after(after))
    }

    /// The latest tick at or before `at`, if any.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.before(at, true)
    }

    /// The latest tick strictly before `before`, if any.
    pub fn previous_before(&self, before: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.before(before, false)
    }

    fn before(&self, at: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        let fits = |tick: &DateTime<Utc>| if inclusive { *tick <= at } else { *tick < at };
        // Wall-clock times at or before `at`'s own (either of whose passes
        // may be `at` itself), backward. Each one's last instant comes
        // before every instant of the ones after it, so the first whose
        // last instant fits ends the walk; a repeated time may have only
        // its first instant fit, which the walk keeps and goes on past.
        let mut wall = self.wall(at);
        let mut best = None;
        for step in 0..MAX_STEPS {
            let Some(previous) = self.wall_previous(wall, step == 0) else { break };
            wall = previous;
            let instants = self.instants(wall);
            best = latest(best, instants.iter().rev().copied().find(fits));
            if instants.last().is_some_and(fits) {
                break;
            }
        }
        // The first pass through a repeated hour comes before the second
        // pass that `at` may be in, though its wall-clock times are later.
        latest(best, self.first_pass_before(at))
    }

    /// The wall-clock time of an instant in the zone.
    fn wall(&self, at: DateTime<Utc>) -> NaiveDateTime {
        at.with_timezone(&self.zone).naive_local()
    }

    /// The zone's offset from UTC at an instant.
    fn offset(&self, at: DateTime<Utc>) -> TimeDelta {
        TimeDelta::seconds(i64::from(self.zone.offset_from_utc_datetime(&at.naive_utc()).fix().local_minus_utc()))
    }

    /// The first wall-clock time the expression names after `wall` (or at
    /// it, when `inclusive`), in wall-clock arithmetic: no zone, no gaps.
    fn wall_next(&self, wall: NaiveDateTime, inclusive: bool) -> Option<NaiveDateTime> {
        // Cron has no field finer than a second: a time past a whole second
        // is after every match at or before that second.
        let (whole, fraction) = whole_second(wall);
        let start = Utc.from_utc_datetime(&whole);
        self.cron.find_next_occurrence(&start, inclusive && !fraction).ok().map(|t| t.naive_utc())
    }

    /// The last wall-clock time the expression names before `wall` (or at it).
    fn wall_previous(&self, wall: NaiveDateTime, inclusive: bool) -> Option<NaiveDateTime> {
        let (whole, fraction) = whole_second(wall);
        let start = Utc.from_utc_datetime(&whole);
        self.cron.find_previous_occurrence(&start, inclusive || fraction).ok().map(|t| t.naive_utc())
    }

    /// The ticks a wall-clock time the expression names stands for, earliest
    /// first: normally one; both passes of a repeated time (the first only,
    /// for a fixed-time expression); for a fixed-time expression whose time
    /// the clocks skip, the first instant after the gap.
    fn instants(&self, wall: NaiveDateTime) -> Vec<DateTime<Utc>> {
        match self.zone.from_local_datetime(&wall) {
            LocalResult::Single(tick) => vec![tick.to_utc()],
            LocalResult::Ambiguous(first, _) if self.fixed => vec![first.to_utc()],
            LocalResult::Ambiguous(first, second) => vec![first.to_utc(), second.to_utc()],
            LocalResult::None if self.fixed => self.after_gap(wall).into_iter().collect(),
            LocalResult::None => Vec::new(),
        }
    }

    /// The first instant after the gap that `wall` falls in.
    fn after_gap(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        let mut probe = wall;
        for _ in 0..NEAR_CHANGE.num_seconds() {
            probe += TimeDelta::seconds(1);
            if let Some(tick) = self.zone.from_local_datetime(&probe).earliest() {
                return Some(tick.to_utc());
            }
        }
        None
    }

    /// Where the clocks fall back between `from` and `to` (one change at
    /// most, so closer than [`NEAR_CHANGE`]): the first instant on the new
    /// offset, and the offsets before and after.
    fn fall_back_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, TimeDelta, TimeDelta)> {
        let (before, after) = (self.offset(from), self.offset(to));
        if after >= before {
            return None;
        }
        // Zones change offset on a whole second. The offset is `before` at
        // `low` and `after` at `high`: halve to the second it changes.
        let (mut low, mut high) = (from.timestamp(), to.timestamp() + 1);
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if self.offset(DateTime::from_timestamp(middle, 0)?) == before {
                low = middle;
            } else {
                high = middle;
            }
        }
        Some((DateTime::from_timestamp(high, 0)?, before, after))
    }

    /// The first tick of the second pass through a repeated hour that
    /// begins within [`NEAR_CHANGE`] after `after`: later than the
    /// wall-clock times that follow `after`'s own in the first pass.
    fn second_pass_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.fixed {
            return None;
        }
        let (change, before, later) = self.fall_back_between(after, after + NEAR_CHANGE)?;
        // The repeated wall-clock times, read the second time on the new offset.
        let start = change.naive_utc() + later;
        let end = start + (before - later);
        let wall = self.wall_next(start, true).filter(|wall| *wall < end)?;
        Some(Utc.from_utc_datetime(&(wall - later))).filter(|tick| *tick > after)
    }

    /// The last tick of the first pass through a repeated hour whose second
    /// pass began within [`NEAR_CHANGE`] before `at`.
    fn first_pass_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let (change, before, later) = self.fall_back_between(at - NEAR_CHANGE, at)?;
        // The repeated wall-clock times, read the first time on the old offset.
        let start = change.naive_utc() + later;
        let end = start + (before - later);
        let wall = self.wall_previous(end, false).filter(|wall| *wall >= start)?;
        // Every instant of the first pass is before the change, so before `at`.
        Some(Utc.from_utc_datetime(&(wall - before)))
    }
}

/// A wall-clock time to the whole second, and whether it had a fraction.
fn whole_second(wall: NaiveDateTime) -> (NaiveDateTime, bool) {
    let fraction = wall.nanosecond() != 0;
    (wall.with_nanosecond(0).unwrap_or(wall), fraction)
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn latest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    a.max(b)
}

/// The ticks one look at a schedule enqueues, oldest first: those after
/// `cursor` (the last tick the fleet enqueued) up to `now`. A tick that came
/// due after `watching_since` (this host was looking at the schedule then,
/// and the tick was simply due) is always enqueued; the ticks before it were
/// missed while no host looked, and of those only the latest `backfill` are
/// enqueued. Walks backward from `now`, so an outage of any length costs at
/// most `backfill` steps, plus one per tick since `watching_since`.
pub fn due_ticks(
    calendar: &Calendar,
    cursor: DateTime<Utc>,
    watching_since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    backfill: u32,
) -> Vec<DateTime<Utc>> {
    let mut ticks = Vec::new();
    let mut missed = 0;
    let mut next = calendar.latest_at_or_before(now);
    while let Some(tick) = next.filter(|tick| *tick > cursor) {
        if watching_since.is_some_and(|since| tick > since) {
            ticks.push(tick);
        } else if missed < backfill {
            ticks.push(tick);
            missed += 1;
        } else {
            break;
        }
        next = calendar.previous_before(tick);
    }
    ticks.reverse();
    ticks
}

/// Checks a schedule as a component declared it.
///
/// # Errors
/// The reason, naming the bad part.
pub fn check(config: &ScheduleConfig) -> Result<(), String> {
    let calendar = Calendar::new(config)?;
    // From a fixed instant, so the check does not depend on when it runs:
    // an expression such as `0 0 30 2 *` (30 February) never ticks, and
    // would cost every look a fruitless search.
    if calendar.next_after(DateTime::UNIX_EPOCH).is_none() {
        return Err(format!("{:?} names no time that exists", config.cron));
    }
    if config.backfill > MAX_BACKFILL {
        return Err(format!("backfill {} is more than the most allowed, {MAX_BACKFILL}", config.backfill));
    }
    if config.payload.contains_key(TICK_FIELD) {
        return Err(format!("the payload may not have a {TICK_FIELD:?} field: the host adds it"));
    }
    Ok(())
}

/// A tick as its job's payload gives it: RFC 3339 in UTC, to the second
/// when it is a whole second (cron ticks always are).
pub fn tick_text(tick: &DateTime<Utc>) -> String {
    tick.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn calendar(cron: &str, zone: &str) -> Calendar {
        Calendar::new(&ScheduleConfig { time_zone: zone.into(), ..ScheduleConfig::new(cron) }).unwrap()
    }

    /// Every tick in (from, to], walking forward.
    fn forward(calendar: &Calendar, from: &str, to: &str) -> Vec<DateTime<Utc>> {
        let (mut t, to) = (at(from), at(to));
        let mut ticks = Vec::new();
        while let Some(next) = calendar.next_after(t).filter(|next| *next <= to) {
            assert!(next > t, "next_after({t}) went back to {next}");
            ticks.push(next);
            t = next;
        }
        ticks
    }

    /// Every tick in (from, to], walking backward, oldest first.
    fn backward(calendar: &Calendar, from: &str, to: &str) -> Vec<DateTime<Utc>> {
        let (from, mut t) = (at(from), at(to));
        let mut ticks = Vec::new();
        let mut next = calendar.latest_at_or_before(t);
        while let Some(tick) = next.filter(|tick| *tick > from) {
            assert!(tick <= t, "went forward from {t} to {tick}");
            ticks.push(tick);
            t = tick;
            next = calendar.previous_before(tick);
        }
        ticks.reverse();
        ticks
    }

    fn texts(ticks: &[DateTime<Utc>]) -> Vec<String> {
        ticks.iter().map(tick_text).collect()
    }

    #[test]
    fn reads_five_and_six_fields() {
        let every_5_minutes = calendar("*/5 * * * *", "UTC");
        assert_eq!(every_5_minutes.next_after(at("2026-01-01T00:00:00Z")), Some(at("2026-01-01T00:05:00Z")));
        let every_second = calendar("* * * * * *", "UTC");
        assert_eq!(every_second.next_after(at("2026-01-01T00:00:00Z")), Some(at("2026-01-01T00:00:01Z")));
        assert_eq!(every_second.next_after(at("2026-01-01T00:00:00.5Z")), Some(at("2026-01-01T00:00:01Z")));
        assert_eq!(every_second.latest_at_or_before(at("2026-01-01T00:00:00.5Z")), Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(every_second.latest_at_or_before(at("2026-01-01T00:00:01Z")), Some(at("2026-01-01T00:00:01Z")));
        assert_eq!(every_second.previous_before(at("2026-01-01T00:00:01Z")), Some(at("2026-01-01T00:00:00Z")));
    }

    #[test]
    fn follows_the_zone_through_daylight_saving() {
        let berlin_nine = calendar("0 9 * * *", "Europe/Berlin");
        // 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer.
        assert_eq!(berlin_nine.next_after(at("2026-01-10T12:00:00Z")), Some(at("2026-01-11T08:00:00Z")));
        assert_eq!(berlin_nine.next_after(at("2026-07-10T12:00:00Z")), Some(at("2026-07-11T07:00:00Z")));
        // The day the clocks go forward (29 March 2026) and the next.
        assert_eq!(
            texts(&forward(&berlin_nine, "2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z")),
            ["2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z"]
        );
    }

    #[test]
    fn an_interval_ticks_through_both_passes_of_a_repeated_hour() {
        // Berlin falls back at 01:00 UTC on 25 October 2026: 02:00-03:00 runs twice.
        let half_hourly = calendar("*/30 * * * *", "Europe/Berlin");
        let expected = [
            "2026-10-24T23:30:00Z", // 01:30 CEST
            "2026-10-25T00:00:00Z", // 02:00 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-25T01:00:00Z", // 02:00 CET
            "2026-10-25T01:30:00Z", // 02:30 CET
            "2026-10-25T02:00:00Z", // 03:00 CET
        ];
        assert_eq!(texts(&forward(&half_hourly, "2026-10-24T23:00:00Z", "2026-10-25T02:00:00Z")), expected);
        assert_eq!(texts(&backward(&half_hourly, "2026-10-24T23:00:00Z", "2026-10-25T02:00:00Z")), expected);
        // From inside the first pass, the next tick is the second pass's first.
        assert_eq!(half_hourly.next_after(at("2026-10-25T00:45:00Z")), Some(at("2026-10-25T01:00:00Z")));
        // From inside the second pass, the previous tick is the first pass's last.
        assert_eq!(half_hourly.previous_before(at("2026-10-25T01:00:00Z")), Some(at("2026-10-25T00:30:00Z")));
    }

    #[test]
    fn an_interval_skips_the_hour_the_clocks_spring_over() {
        // Berlin springs forward at 01:00 UTC on 29 March 2026: 02:00-03:00 does not exist.
        let half_hourly = calendar("*/30 * * * *", "Europe/Berlin");
        let expected = [
            "2026-03-29T00:30:00Z", // 01:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST
            "2026-03-29T01:30:00Z", // 03:30 CEST
        ];
        assert_eq!(texts(&forward(&half_hourly, "2026-03-29T00:00:00Z", "2026-03-29T01:30:00Z")), expected);
        assert_eq!(texts(&backward(&half_hourly, "2026-03-29T00:00:00Z", "2026-03-29T01:30:00Z")), expected);
    }

    #[test]
    fn a_fixed_time_ticks_once_a_day_through_either_change() {
        let half_past_two = calendar("30 2 * * *", "Europe/Berlin");
        // Skipped on 29 March: at the first instant after the gap, 03:00 CEST.
        let spring = ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"];
        assert_eq!(texts(&forward(&half_past_two, "2026-03-28T00:00:00Z", "2026-03-30T12:00:00Z")), spring);
        assert_eq!(texts(&backward(&half_past_two, "2026-03-28T00:00:00Z", "2026-03-30T12:00:00Z")), spring);
        // Repeated on 25 October: the first pass only (02:30 CEST).
        let autumn = ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"];
        assert_eq!(texts(&forward(&half_past_two, "2026-10-24T00:00:00Z", "2026-10-26T12:00:00Z")), autumn);
        assert_eq!(texts(&backward(&half_past_two, "2026-10-24T00:00:00Z", "2026-10-26T12:00:00Z")), autumn);
        // From inside the second pass, the previous tick is the first pass's.
        assert_eq!(half_past_two.previous_before(at("2026-10-25T01:15:00Z")), Some(at("2026-10-25T00:30:00Z")));
    }

    /// Every tick in (from, to], by looking at each minute of real time on
    /// its own (the expressions tested tick on whole minutes): a matching
    /// wall-clock time is a tick unless it is the second pass of a repeated
    /// time of a fixed-time expression; the first minute after a gap is a
    /// tick of a fixed-time expression whose time the gap skipped.
    fn by_each_minute(calendar: &Calendar, from: &str, to: &str) -> Vec<DateTime<Utc>> {
        let matches = |wall: NaiveDateTime| calendar.cron.is_time_matching(&Utc.from_utc_datetime(&wall)).unwrap();
        let minute = TimeDelta::minutes(1);
        let (mut t, to) = (at(from) + minute, at(to));
        let mut ticks = Vec::new();
        while t <= to {
            let wall = calendar.wall(t);
            let second_pass = match calendar.zone.from_local_datetime(&wall) {
                LocalResult::Ambiguous(_, second) => second.to_utc() == t,
                _ => false,
            };
            let skipped = calendar.wall(t - minute) + minute < wall;
            let gap_matched = skipped && {
                let mut gap = calendar.wall(t - minute) + minute;
                let mut any = false;
                while gap < wall {
                    any |= matches(gap);
                    gap += minute;
                }
                any
            };
            if (matches(wall) && !(calendar.fixed && second_pass)) || (calendar.fixed && gap_matched) {
                ticks.push(t);
            }
            t += minute;
        }
        ticks
    }

    #[test]
    fn walking_either_way_gives_the_ticks_of_each_minute_around_every_change() {
        // Zones that move by an hour either way, by half an hour (Lord Howe),
        // and southern-hemisphere dates; expressions of every kind.
        let cases = [
            ("Europe/Berlin", "2026-03-28T20:00:00Z", "2026-03-29T06:00:00Z"),
            ("Europe/Berlin", "2026-10-24T20:00:00Z", "2026-10-25T06:00:00Z"),
            ("America/New_York", "2026-03-08T02:00:00Z", "2026-03-08T10:00:00Z"),
            ("America/New_York", "2026-11-01T02:00:00Z", "2026-11-01T10:00:00Z"),
            ("Australia/Lord_Howe", "2026-04-04T12:00:00Z", "2026-04-04T18:00:00Z"),
            ("Australia/Lord_Howe", "2026-10-03T12:00:00Z", "2026-10-03T18:00:00Z"),
        ];
        let crons = ["*/7 * * * *", "5,50 * * * *", "0 30 2 * * *", "0 45 1 * * *", "0 */20 1-3 * * *", "15 * * * *"];
        for (zone, from, to) in cases {
            for cron in crons {
                let calendar = calendar(cron, zone);
                let forward = forward(&calendar, from, to);
                assert!(!forward.is_empty(), "{cron} in {zone}");
                assert_eq!(
                    texts(&forward),
                    texts(&by_each_minute(&calendar, from, to)),
                    "{cron} in {zone}, {from} to {to}"
                );
                assert_eq!(forward, backward(&calendar, from, to), "{cron} in {zone}, {from} to {to}");
            }
        }
    }

    #[test]
    fn a_watched_schedule_enqueues_every_tick_since_the_cursor() {
        let every_second = calendar("* * * * * *", "UTC");
        let ticks = due_ticks(
            &every_second,
            at("2026-01-01T00:00:00Z"),
            Some(at("2026-01-01T00:00:00.2Z")),
            at("2026-01-01T00:00:03.5Z"),
            1,
        );
        assert_eq!(texts(&ticks), ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z", "2026-01-01T00:00:03Z"]);
        // Nothing new since the cursor: nothing.
        let none = due_ticks(&every_second, at("2026-01-01T00:00:03Z"), None, at("2026-01-01T00:00:03.9Z"), 1);
        assert!(none.is_empty());
    }

    #[test]
    fn missed_ticks_catch_up_with_the_latest_only() {
        let every_minute = calendar("* * * * *", "UTC");
        let cursor = at("2026-01-01T00:00:00Z");
        let now = at("2026-01-01T01:00:30Z");
        // Every host was down for an hour: one catch-up job, for the latest tick.
        assert_eq!(texts(&due_ticks(&every_minute, cursor, None, now, 1)), ["2026-01-01T01:00:00Z"]);
        // backfill 3: the latest three, oldest first.
        assert_eq!(
            texts(&due_ticks(&every_minute, cursor, None, now, 3)),
            ["2026-01-01T00:58:00Z", "2026-01-01T00:59:00Z", "2026-01-01T01:00:00Z"]
        );
        // backfill 0: none of the missed ones.
        assert!(due_ticks(&every_minute, cursor, None, now, 0).is_empty());
        // Never before the cursor, whatever the backfill.
        assert_eq!(due_ticks(&every_minute, at("2026-01-01T00:58:00Z"), None, now, 100).len(), 2);
    }

    #[test]
    fn a_host_that_starts_watching_catches_up_then_enqueues_every_tick() {
        let every_second = calendar("* * * * * *", "UTC");
        // The host has looked since 00:00:10; the fleet's cursor is at 00:00:05 (a gap
        // before this host looked): the ticks since it looked are due, plus the
        // latest two missed before.
        let ticks = due_ticks(
            &every_second,
            at("2026-01-01T00:00:05Z"),
            Some(at("2026-01-01T00:00:10Z")),
            at("2026-01-01T00:00:12.5Z"),
            2,
        );
        assert_eq!(
            texts(&ticks),
            ["2026-01-01T00:00:09Z", "2026-01-01T00:00:10Z", "2026-01-01T00:00:11Z", "2026-01-01T00:00:12Z"]
        );
    }

    #[test]
    fn catch_up_counts_ticks_not_hours_across_a_repeated_hour() {
        // An outage across Berlin's autumn change: the latest two ticks are the
        // second pass's, an hour of real time after the first pass's.
        let half_hourly = calendar("*/30 * * * *", "Europe/Berlin");
        let ticks = due_ticks(&half_hourly, at("2026-10-24T20:00:00Z"), None, at("2026-10-25T01:45:00Z"), 2);
        assert_eq!(texts(&ticks), ["2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z"]);
    }

    #[test]
    fn refuses_bad_parts_by_name() {
        assert!(check(&ScheduleConfig::new("61 * * * *")).unwrap_err().contains("cron"));
        assert!(check(&ScheduleConfig::new("0 0 30 2 *")).unwrap_err().contains("no time"));
        let zone = ScheduleConfig { time_zone: "Mars/Olympus".into(), ..ScheduleConfig::new("* * * * *") };
        assert!(check(&zone).unwrap_err().contains("time zone"));
        let backfill = ScheduleConfig { backfill: MAX_BACKFILL + 1, ..ScheduleConfig::new("* * * * *") };
        assert!(check(&backfill).unwrap_err().contains("backfill"));
        let mut tick = ScheduleConfig::new("* * * * *");
        tick.payload.insert(TICK_FIELD.into(), serde_json::json!(1));
        assert!(check(&tick).unwrap_err().contains("_tick"));
    }

    #[test]
    fn a_tick_reads_as_rfc_3339_utc() {
        assert_eq!(tick_text(&at("2026-03-29T03:00:00+02:00")), "2026-03-29T01:00:00Z");
    }
}
