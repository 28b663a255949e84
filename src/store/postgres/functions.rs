//! The SQL functions, one living file each (`functions/NAME.sql`, every
//! signature of that name), applied by a host after the migrations when a
//! file's content differs from what the database records: a change to a
//! function is an ordinary diff of its file, and migrations keep tables,
//! indexes and data moves. Earlier copies of the bodies stay in the
//! migrations that first defined them, as history: a fresh database runs
//! them, then the files.
//!
//! A migration that needs a function as its file has it (a trigger that
//! calls a new function, a data move through one) names it in a header
//! line, `-- functions: NAME, NAME`: those files are applied and recorded
//! first, in the migration's own transaction ([`for_migration`]), so the
//! migration never carries a copy of a body and commits or rolls back with
//! the functions it needs.
//!
//! A rolling upgrade: the files carry a generation ([`GENERATION`]), raised
//! with every change to any of them, and the database records which
//! generation applied each function. A host applies a file only when its
//! own generation is at least the recorded one, so a host of the previous
//! version starting beside a newer one never puts the older bodies back;
//! a function change must keep working for the previous version's callers
//! (the same arguments and results), as a migration's must.

use std::collections::HashMap;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection};

use crate::store::{Error, Result};

/// Every function file, by name.
pub const SOURCES: &[(&str, &str)] = &[
    ("admit", include_str!("functions/admit.sql")),
    ("archive_ended", include_str!("functions/archive_ended.sql")),
    ("archive_flag_late", include_str!("functions/archive_flag_late.sql")),
    ("audit_write", include_str!("functions/audit_write.sql")),
    ("batch_add_members", include_str!("functions/batch_add_members.sql")),
    ("batch_callback_payload", include_str!("functions/batch_callback_payload.sql")),
    ("batch_close", include_str!("functions/batch_close.sql")),
    ("batch_open", include_str!("functions/batch_open.sql")),
    ("batch_retry_member", include_str!("functions/batch_retry_member.sql")),
    ("batch_settle", include_str!("functions/batch_settle.sql")),
    ("calendar_of", include_str!("functions/calendar_of.sql")),
    ("claim_and_insert_jobs", include_str!("functions/claim_and_insert_jobs.sql")),
    ("claim_new_keys", include_str!("functions/claim_new_keys.sql")),
    ("claim_unique", include_str!("functions/claim_unique.sql")),
    ("claims_likely_new", include_str!("functions/claims_likely_new.sql")),
    ("discard", include_str!("functions/discard.sql")),
    ("discard_each", include_str!("functions/discard_each.sql")),
    ("enqueue", include_str!("functions/enqueue.sql")),
    ("enqueue_as", include_str!("functions/enqueue_as.sql")),
    ("enqueue_many", include_str!("functions/enqueue_many.sql")),
    ("event_matches", include_str!("functions/event_matches.sql")),
    ("event_send", include_str!("functions/event_send.sql")),
    ("expire_leases", include_str!("functions/expire_leases.sql")),
    ("expiry_charges", include_str!("functions/expiry_charges.sql")),
    ("expiry_ends", include_str!("functions/expiry_ends.sql")),
    ("fetch", include_str!("functions/fetch.sql")),
    ("fetch_ahead", include_str!("functions/fetch_ahead.sql")),
    ("finish_runs", include_str!("functions/finish_runs.sql")),
    ("finish_runs_unless_locked", include_str!("functions/finish_runs_unless_locked.sql")),
    ("insert_jobs", include_str!("functions/insert_jobs.sql")),
    ("job_types_forward_only", include_str!("functions/job_types_forward_only.sql")),
    ("keep_newest_errors", include_str!("functions/keep_newest_errors.sql")),
    ("key_renders", include_str!("functions/key_renders.sql")),
    ("lock_for_ending", include_str!("functions/lock_for_ending.sql")),
    ("notify_available", include_str!("functions/notify_available.sql")),
    ("park", include_str!("functions/park.sql")),
    ("promotable_keys", include_str!("functions/promotable_keys.sql")),
    ("promote_due", include_str!("functions/promote_due.sql")),
    ("promote_parked", include_str!("functions/promote_parked.sql")),
    ("rate_governed", include_str!("functions/rate_governed.sql")),
    ("rate_key", include_str!("functions/rate_key.sql")),
    ("rate_start", include_str!("functions/rate_start.sql")),
    ("rate_throttle", include_str!("functions/rate_throttle.sql")),
    ("reclaim_unique", include_str!("functions/reclaim_unique.sql")),
    ("release_slots", include_str!("functions/release_slots.sql")),
    ("release_slots_leasing", include_str!("functions/release_slots_leasing.sql")),
    ("release_unique_run", include_str!("functions/release_unique_run.sql")),
    ("render_key", include_str!("functions/render_key.sql")),
    ("repair_semaphores", include_str!("functions/repair_semaphores.sql")),
    ("replace_waiting", include_str!("functions/replace_waiting.sql")),
    ("schedule_remove", include_str!("functions/schedule_remove.sql")),
    ("schedule_upsert", include_str!("functions/schedule_upsert.sql")),
    ("schedules_follow_registration", include_str!("functions/schedules_follow_registration.sql")),
    ("semaphore_page", include_str!("functions/semaphore_page.sql")),
    ("slot_limit", include_str!("functions/slot_limit.sql")),
    ("take_slot", include_str!("functions/take_slot.sql")),
    ("take_slots", include_str!("functions/take_slots.sql")),
    ("unpaused", include_str!("functions/unpaused.sql")),
    ("workflow_cancel", include_str!("functions/workflow_cancel.sql")),
    ("workflow_create", include_str!("functions/workflow_create.sql")),
    ("workflow_grow", include_str!("functions/workflow_grow.sql")),
    ("workflow_jobs_ended", include_str!("functions/workflow_jobs_ended.sql")),
    ("workflow_release", include_str!("functions/workflow_release.sql")),
    ("workflow_step_archive", include_str!("functions/workflow_step_archive.sql")),
    ("workflow_steps_ended", include_str!("functions/workflow_steps_ended.sql")),
    ("workflow_waits_arm", include_str!("functions/workflow_waits_arm.sql")),
    ("workflow_waits_due", include_str!("functions/workflow_waits_due.sql")),
    ("workflow_waits_end", include_str!("functions/workflow_waits_end.sql")),
];

/// The functions' generation, and the digest of every file in name order
/// that it stands for: a test fails when the files change and this does
/// not, asking for the next generation.
pub const GENERATION: (i64, &str) = (9, "60c7ce7da5ae003cb474815837b126fda6729de40a7d43c4bcb82f1f11dc5a08");

/// The digest of every file in name order, as [`GENERATION`] records it.
pub fn sources_digest() -> String {
    let mut hasher = Sha256::new();
    for (_, source) in SOURCES {
        hasher.update(source.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Records a file as applied (with `VALUES (name, digest, generation)`
/// between the two), by the pass and by a migration alike, so both leave
/// the same record.
const RECORD_INTO: &str = "INSERT INTO jobhost.function_sources (name, sha256, generation)";
const RECORD_OVER: &str = "ON CONFLICT (name) DO UPDATE
    SET sha256 = EXCLUDED.sha256, generation = EXCLUDED.generation, applied_at = now()";

/// The word of the header line by which a migration names the files it
/// needs (`-- functions: NAME, NAME`).
const NEEDS: &str = "functions";

/// The function files a migration names in its header (the comment and
/// blank lines it opens with), in the order named. A line naming functions
/// anywhere else is refused rather than ignored: the migration would run
/// on the bodies the database happens to have.
///
/// # Errors
/// A name no file has, or a `functions:` line after the header.
pub fn needed_by(sql: &str) -> std::result::Result<Vec<&'static str>, String> {
    let mut in_header = true;
    let mut named = Vec::new();
    for line in sql.lines().map(str::trim) {
        in_header &= line.is_empty() || line.starts_with("--");
        let Some(names) = naming(line) else { continue };
        if !in_header {
            return Err(format!("names functions after its header, where they would not be applied: {line}"));
        }
        named.extend(names.split(',').map(str::trim).filter(|name| !name.is_empty()));
    }
    named
        .into_iter()
        .map(|name| {
            SOURCES
                .iter()
                .find(|(file, _)| *file == name)
                .map(|(file, _)| *file)
                .ok_or_else(|| format!("names function {name}, which has no file in src/store/postgres/functions/"))
        })
        .collect()
}

/// The names a `-- functions: NAME, ...` line lists (however spaced or cased).
fn naming(line: &str) -> Option<&str> {
    let comment = line.strip_prefix("--")?.trim_start();
    let (word, names) = comment.split_once(':')?;
    word.trim().eq_ignore_ascii_case(NEEDS).then_some(names)
}

/// The statements that apply and record the named files, to run at the
/// start of a migration's transaction: each body as its file has it, and
/// its digest under this generation, so the pass after the migrations
/// finds it current. Bodies are not checked while they are created (a
/// body may call a function the next file creates); the check is back on
/// for the migration's own statements. The record overwrites any other:
/// a migration not yet applied means no newer host has migrated this
/// database (hosts migrate in version order, one at a time), so no newer
/// generation's body can be there.
pub fn for_migration(names: &[&str]) -> String {
    let mut sql = String::from("SET LOCAL check_function_bodies = off;\n");
    for name in names {
        let (_, source) = SOURCES.iter().find(|(file, _)| file == name).expect("a name from needed_by");
        let digest = hex::encode(Sha256::digest(source.as_bytes()));
        sql.push_str(source);
        // Names and digests are the binary's own (a file name, hex): safe as literals.
        sql.push_str(&format!("\n;\n{RECORD_INTO} VALUES ('{name}', '{digest}', {}) {RECORD_OVER};\n", GENERATION.0));
    }
    sql.push_str("SET LOCAL check_function_bodies TO DEFAULT;\n");
    sql
}

/// How long the step may keep waiting for a lock before it gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(300);

/// Applies each function file whose content the database has not recorded
/// under this generation or a later one, in one transaction (bodies are not
/// checked against each other while they are replaced, so the order does
/// not matter). Returns how many it applied. Runs while the caller holds
/// the migrating turn, with its short lock timeout: a lock wait is retried,
/// and so is a function another transaction replaced meanwhile (the pass
/// then puts the file's body over it).
///
/// # Errors
/// A file the database refuses, or a lock held past [`GIVE_UP_AFTER`].
pub async fn apply(conn: &mut PgConnection) -> Result<usize> {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match apply_once(conn).await {
            Err(error)
                if (error.is_lock_timeout() || error.is_concurrent_definition())
                    && started.elapsed() < GIVE_UP_AFTER =>
            {
                tracing::warn!(%error, "applying the SQL functions met another transaction's change; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            done => return done,
        }
    }
}

async fn apply_once(conn: &mut PgConnection) -> Result<usize> {
    let mut tx = conn.begin().await?;
    sqlx::query("SET LOCAL check_function_bodies = off").execute(&mut *tx).await?;
    let recorded: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT name, sha256, generation FROM jobhost.function_sources").fetch_all(&mut *tx).await?;
    let recorded: HashMap<String, (String, i64)> =
        recorded.into_iter().map(|(name, sha, generation)| (name, (sha, generation))).collect();
    let mut applied = 0;
    for (name, source) in SOURCES {
        let digest = hex::encode(Sha256::digest(source.as_bytes()));
        match recorded.get(*name) {
            Some((sha, _)) if *sha == digest => continue,
            // A newer host applied it: its body stays.
            Some((_, generation)) if *generation > GENERATION.0 => continue,
            _ => {}
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(*source)).execute(&mut *tx).await.map_err(|e| match Error::from(e) {
            again @ Error::Database(_) if again.is_lock_timeout() || again.is_concurrent_definition() => again,
            refused => Error::FunctionRefused { name: name.to_string(), reason: refused.to_string() },
        })?;
        sqlx::query(sqlx::AssertSqlSafe(format!("{RECORD_INTO} VALUES ($1, $2, $3) {RECORD_OVER}")))
            .bind(name)
            .bind(&digest)
            .bind(GENERATION.0)
            .execute(&mut *tx)
            .await?;
        applied += 1;
    }
    tx.commit().await?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_names_files_in_order_and_a_body_line_names_none() {
        let sql = "\n-- Why this migration.\n\n-- functions: render_key, park\n--Functions:fetch\nCREATE TABLE t ();\n";
        assert_eq!(needed_by(sql).unwrap(), ["render_key", "park", "fetch"]);
        let late = "CREATE TABLE t ();\n-- functions: fetch\n";
        assert!(needed_by(late).unwrap_err().contains("after its header"));
        assert!(needed_by("-- Whose functions: none of ours.\n").unwrap().is_empty());
        assert!(needed_by("-- functions: render_key, no_such\n").unwrap_err().contains("no_such"));
        assert!(needed_by("CREATE TABLE t ();").unwrap().is_empty());
    }

    #[test]
    fn the_statements_apply_each_body_then_record_it_under_this_generation() {
        let sql = for_migration(&["park", "render_key"]);
        let park = sql.find("FUNCTION jobhost.park").unwrap();
        let render = sql.find("FUNCTION jobhost.render_key").unwrap();
        assert!(sql.starts_with("SET LOCAL check_function_bodies = off;") && park < render);
        let digest = hex::encode(Sha256::digest(SOURCES.iter().find(|(n, _)| *n == "park").unwrap().1.as_bytes()));
        assert!(sql.contains(&format!("VALUES ('park', '{digest}', {})", GENERATION.0)));
        assert!(sql.trim_end().ends_with("SET LOCAL check_function_bodies TO DEFAULT;"));
    }
}
