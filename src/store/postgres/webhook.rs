//! Inbound webhooks in PostgreSQL (`jobhost.webhooks`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::WebhookDriver;
use crate::store::webhook::{Webhook, style_of};

type Row = (String, String, String, String, i32, DateTime<Utc>);

fn webhook_of((name, event_key, style, secret, tolerance_secs, created_at): Row) -> Result<Webhook> {
    Ok(Webhook { name, event_key, style: style_of(&style)?, secret, tolerance_secs: tolerance_secs.into(), created_at })
}

#[async_trait]
impl WebhookDriver for PgStore {
    async fn webhook_set(&self, change: &Change<'_>, webhook: &Webhook) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| {
            let replaced: bool = sqlx::query_scalar(
                "INSERT INTO jobhost.webhooks AS w (name, event_key, style, secret, tolerance_secs)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE
             SET event_key = EXCLUDED.event_key, style = EXCLUDED.style, secret = EXCLUDED.secret,
                 tolerance_secs = EXCLUDED.tolerance_secs
             RETURNING xmax <> 0",
            )
            .bind(&webhook.name)
            .bind(&webhook.event_key)
            .bind(webhook.style.as_str())
            .bind(&webhook.secret)
            .bind(i32::try_from(webhook.tolerance_secs).unwrap_or(i32::MAX))
            .fetch_one(conn)
            .await?;
            Ok(replaced)
        })
        .await
    }

    async fn webhook_delete(&self, change: &Change<'_>, name: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| {
            let deleted = sqlx::query("DELETE FROM jobhost.webhooks WHERE name = $1").bind(name).execute(conn).await?;
            Ok(deleted.rows_affected() > 0)
        })
        .await
    }

    async fn webhook_get(&self, name: &str) -> Result<Option<Webhook>> {
        let row: Option<Row> = sqlx::query_as(
            "SELECT name, event_key, style, secret, tolerance_secs, created_at FROM jobhost.webhooks WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(webhook_of).transpose()
    }

    async fn webhook_list(&self) -> Result<Vec<Webhook>> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, event_key, style, secret, tolerance_secs, created_at FROM jobhost.webhooks ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(webhook_of).collect()
    }
}
