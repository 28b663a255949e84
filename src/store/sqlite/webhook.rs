//! Inbound webhooks in SQLite (`webhooks`).

use async_trait::async_trait;

use super::SqliteStore;
use super::encode::{now_ms, time_of};
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::WebhookDriver;
use crate::store::webhook::{Webhook, style_of};

type Row = (String, String, String, String, i64, i64);

fn webhook_of((name, event_key, style, secret, tolerance_secs, created_at): Row) -> Result<Webhook> {
    Ok(Webhook { name, event_key, style: style_of(&style)?, secret, tolerance_secs, created_at: time_of(created_at) })
}

#[async_trait]
impl WebhookDriver for SqliteStore {
    async fn webhook_set(&self, change: &Change<'_>, webhook: &Webhook) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| {
            let replaced = sqlx::query("DELETE FROM webhooks WHERE name = $1")
                .bind(&webhook.name)
                .execute(&mut **tx)
                .await?
                .rows_affected()
                > 0;
            sqlx::query(
                "INSERT INTO webhooks (name, event_key, style, secret, tolerance_secs, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&webhook.name)
            .bind(&webhook.event_key)
            .bind(webhook.style.as_str())
            .bind(&webhook.secret)
            .bind(webhook.tolerance_secs)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
            Ok(replaced)
        })
        .await
    }

    async fn webhook_delete(&self, change: &Change<'_>, name: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| {
            let deleted = sqlx::query("DELETE FROM webhooks WHERE name = $1").bind(name).execute(&mut **tx).await?;
            Ok(deleted.rows_affected() > 0)
        })
        .await
    }

    async fn webhook_get(&self, name: &str) -> Result<Option<Webhook>> {
        let row: Option<Row> = sqlx::query_as(
            "SELECT name, event_key, style, secret, tolerance_secs, created_at FROM webhooks WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.reader)
        .await?;
        row.map(webhook_of).transpose()
    }

    async fn webhook_list(&self) -> Result<Vec<Webhook>> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, event_key, style, secret, tolerance_secs, created_at FROM webhooks ORDER BY name",
        )
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(webhook_of).collect()
    }
}
