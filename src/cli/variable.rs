//! `jobhost var`: a job type's plain variables, stored in the database and
//! given to its runs as environment variables, in clear (a value to hide
//! is a secret: `jobhost secret set`).

use std::process::ExitCode;

use chrono::SecondsFormat;
use clap::Subcommand;

use super::operator::open_existing;
use super::{DbArgs, fail};
use crate::store::variable::{MAX_PER_TYPE, MAX_VALUE_BYTES};

/// What to do with a job type's variables.
#[derive(Debug, Subcommand)]
pub enum VarAction {
    /// Set a variable of a job type; its runs see it within seconds.
    Set {
        /// The job type.
        job_type: String,
        /// The variable's name in the run's environment.
        #[arg(value_parser = crate::outbound::environment_name)]
        name: String,
        /// Its value, in clear.
        value: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Remove a variable of a job type.
    Unset {
        /// The job type.
        job_type: String,
        /// The variable's name.
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// The variables of every job type, or of one, with their values.
    List {
        /// Only this job type's.
        job_type: Option<String>,
        /// One JSON object per variable, one per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub async fn run(action: VarAction) -> ExitCode {
    match action {
        VarAction::Set { job_type, name, value, db } => set(&job_type, &name, &value, &db).await,
        VarAction::Unset { job_type, name, db } => unset(&job_type, &name, &db).await,
        VarAction::List { job_type, json, db } => list(job_type.as_deref(), json, &db).await,
    }
}

async fn set(job_type: &str, name: &str, value: &str, db: &DbArgs) -> ExitCode {
    if value.len() > MAX_VALUE_BYTES {
        return fail(format!("the value is {} bytes; a variable holds at most {MAX_VALUE_BYTES}", value.len()));
    }
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let existing = match store.vars(Some(job_type)).await {
        Ok(existing) => existing,
        Err(error) => return fail(error),
    };
    if existing.len() >= MAX_PER_TYPE && !existing.iter().any(|v| v.name == name) {
        return fail(format!("{job_type} has {MAX_PER_TYPE} variables, the most a type may have"));
    }
    match store.var_set(job_type, name, value).await {
        Ok(replaced) => {
            let verb = if replaced { "changed" } else { "set" };
            println!("{verb}: {job_type}'s runs see {name} within seconds");
            ExitCode::SUCCESS
        }
        Err(error) => fail(error),
    }
}

async fn unset(job_type: &str, name: &str, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    match store.var_unset(job_type, name).await {
        Ok(true) => {
            println!("unset: {job_type}'s runs lose {name} within seconds");
            ExitCode::SUCCESS
        }
        Ok(false) => fail(format!("{job_type} has no variable {name} (see `jobhost var list {job_type}`)")),
        Err(error) => fail(error),
    }
}

async fn list(job_type: Option<&str>, json: bool, db: &DbArgs) -> ExitCode {
    let store = match open_existing(db).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let variables = match store.vars(job_type).await {
        Ok(variables) => variables,
        Err(error) => return fail(error),
    };
    for variable in &variables {
        if json {
            println!("{}", serde_json::to_string(variable).unwrap_or_default());
        } else {
            let updated = format!("updated {}", variable.updated_at.to_rfc3339_opts(SecondsFormat::Secs, true));
            let setting = format!("{} {}={}", variable.job_type, variable.name, variable.value);
            // Within 80 columns: a long value is cut (`--json` has it whole),
            // and the time goes on a line of its own when it does not fit.
            if setting.chars().count() + 2 + updated.chars().count() <= 80 {
                println!("{setting}  {updated}");
            } else {
                println!("{}", crate::text::clip(&setting, 80));
                println!("  {updated}");
            }
        }
    }
    super::say_if_none(
        variables.len(),
        json,
        "no variables: `jobhost var set TYPE NAME VALUE` sets one (see docs/outbound.md)",
    );
    ExitCode::SUCCESS
}
