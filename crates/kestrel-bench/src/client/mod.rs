//! OpenAI-compatible HTTP client with real SSE arrival timing.
//!
//! Times are seconds since a caller-chosen epoch (`Instant`), so the requests
//! of one concurrency step share a clock. `t_sent` is taken immediately before
//! the request is handed to the HTTP stack (reqwest does not report when the
//! last request byte hit the socket; on loopback the gap is microseconds).
//! Arrival times are taken when the bytes completing an SSE event are read.

pub mod sse;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use sse::SseParser;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens` when the server reports it.
    pub cached_tokens: Option<u64>,
}

/// One SSE chunk that carried at least one generated token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenEvent {
    pub t_s: f64,
    /// Cumulative completion tokens, when the server sends usage on every chunk.
    pub completion_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RequestRecord {
    pub label: String,
    pub prompt_chars: usize,
    pub t_sent_s: f64,
    pub t_first_s: Option<f64>,
    pub t_last_s: Option<f64>,
    pub t_done_s: f64,
    pub events: Vec<TokenEvent>,
    pub usage: Option<Usage>,
    pub content_chars: usize,
    pub reasoning_chars: usize,
    /// Generated text (reasoning then content, in arrival order), kept so that
    /// cache-hit and cache-miss outputs can be compared.
    pub output_text: String,
    pub finish_reason: Option<String>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApiKind {
    #[default]
    Chat,
    Completions,
}

impl ApiKind {
    pub fn path(self) -> &'static str {
        match self {
            ApiKind::Chat => "/v1/chat/completions",
            ApiKind::Completions => "/v1/completions",
        }
    }
}

#[derive(Debug, Clone)]
pub struct OpenAiClient {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
}

impl OpenAiClient {
    /// `base_url` like `http://127.0.0.1:8000` (a trailing `/v1` is accepted).
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self> {
        let trimmed = base_url.trim_end_matches('/');
        let base = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("server URL must start with http:// or https://, got {base_url:?}");
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("building HTTP client")?;
        Ok(Self {
            http,
            base_url: base,
            api_key,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.post(format!("{}{}", self.base_url, path));
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.get(format!("{}{}", self.base_url, path));
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    /// Status code of `GET path`, or None when nothing answers.
    pub async fn probe(&self, path: &str) -> Option<u16> {
        let resp = self
            .get(path)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        Some(resp.status().as_u16())
    }

    /// Model ids from `GET /v1/models`.
    pub async fn models(&self) -> Result<Vec<String>> {
        let v: Value = self
            .get("/v1/models")
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .context("GET /v1/models")?
            .error_for_status()?
            .json()
            .await?;
        Ok(v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Prometheus text from `GET /metrics`, when the server exposes it.
    pub async fn metrics_text(&self) -> Option<String> {
        let resp = self
            .get("/metrics")
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    /// Token count of `text` via the server's `/tokenize`, trying the vLLM/SGLang
    /// body (`prompt`) and then the llama-server body (`content`).
    pub async fn tokenize_count(&self, model: &str, text: &str) -> Result<u64> {
        let bodies = [
            serde_json::json!({"model": model, "prompt": text, "add_special_tokens": false}),
            serde_json::json!({"content": text, "add_special": false}),
        ];
        let mut last_err = None;
        for body in bodies {
            match self.post("/tokenize").json(&body).send().await {
                Ok(resp) if resp.status().is_success() => {
                    let v: Value = resp.json().await?;
                    if let Some(n) = v["count"].as_u64() {
                        return Ok(n);
                    }
                    if let Some(t) = v["tokens"].as_array() {
                        return Ok(t.len() as u64);
                    }
                    last_err = Some(anyhow::anyhow!(
                        "/tokenize answer has neither count nor tokens"
                    ));
                }
                Ok(resp) => {
                    last_err = Some(anyhow::anyhow!("/tokenize returned {}", resp.status()))
                }
                Err(e) => last_err = Some(e.into()),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("/tokenize failed")))
    }

    /// Send one streaming request and time every token-bearing chunk.
    /// Never fails: transport and protocol errors land in `RequestRecord::error`.
    pub async fn stream(
        &self,
        api: ApiKind,
        body: &Value,
        label: &str,
        epoch: Instant,
    ) -> RequestRecord {
        let prompt_chars = prompt_chars(body);
        let mut rec = RequestRecord {
            label: label.to_string(),
            prompt_chars,
            ..Default::default()
        };
        let since = |i: Instant| i.duration_since(epoch).as_secs_f64();
        rec.t_sent_s = since(Instant::now());
        let resp = self.post(api.path()).json(body).send().await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                rec.error = Some(format!("request failed: {e}"));
                rec.t_done_s = since(Instant::now());
                return rec;
            }
        };
        rec.http_status = Some(resp.status().as_u16());
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            rec.error = Some(format!("HTTP {status}: {}", truncate(&text, 500)));
            rec.t_done_s = since(Instant::now());
            return rec;
        }
        let mut parser = SseParser::new();
        let mut stream = resp.bytes_stream();
        let mut done = false;
        while let Some(chunk) = stream.next().await {
            let now = Instant::now();
            match chunk {
                Ok(bytes) => {
                    for data in parser.push(&bytes) {
                        done |= apply_event(&mut rec, &data, since(now));
                    }
                }
                Err(e) => {
                    rec.error = Some(format!("stream broken: {e}"));
                    break;
                }
            }
        }
        if let Some(data) = parser.finish() {
            done |= apply_event(&mut rec, &data, since(Instant::now()));
        }
        rec.t_done_s = since(Instant::now());
        if rec.error.is_none() && !done {
            rec.error = Some("stream ended without [DONE]".into());
        }
        rec
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn prompt_chars(body: &Value) -> usize {
    if let Some(p) = body["prompt"].as_str() {
        return p.chars().count();
    }
    body["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| m["content"].as_str())
                .map(|c| c.chars().count())
                .sum()
        })
        .unwrap_or(0)
}

/// Apply one SSE data payload; returns true on the `[DONE]` sentinel.
pub fn apply_event(rec: &mut RequestRecord, data: &str, t_s: f64) -> bool {
    let data = data.trim();
    if data == "[DONE]" {
        return true;
    }
    let v: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            rec.error
                .get_or_insert_with(|| format!("bad SSE JSON ({e}): {}", truncate(data, 200)));
            return false;
        }
    };
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        rec.error
            .get_or_insert_with(|| format!("server error event: {err}"));
        return false;
    }
    let usage = parse_usage(&v["usage"]);
    let mut carried_token = false;
    if let Some(choices) = v["choices"].as_array() {
        for c in choices {
            let delta = &c["delta"];
            for (field, is_reasoning) in [
                ("content", false),
                ("reasoning_content", true),
                ("reasoning", true),
            ] {
                if let Some(s) = delta[field].as_str().filter(|s| !s.is_empty()) {
                    carried_token = true;
                    let n = s.chars().count();
                    rec.output_text.push_str(s);
                    if is_reasoning {
                        rec.reasoning_chars += n
                    } else {
                        rec.content_chars += n
                    }
                }
            }
            if let Some(s) = c["text"].as_str().filter(|s| !s.is_empty()) {
                carried_token = true;
                rec.content_chars += s.chars().count();
                rec.output_text.push_str(s);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                rec.finish_reason = Some(f.to_string());
            }
        }
    }
    if carried_token {
        rec.t_first_s.get_or_insert(t_s);
        rec.t_last_s = Some(t_s);
        rec.events.push(TokenEvent {
            t_s,
            completion_tokens: usage.map(|u| u.completion_tokens),
        });
    }
    if usage.is_some() {
        rec.usage = usage;
    }
    false
}

fn parse_usage(u: &Value) -> Option<Usage> {
    let obj = u.as_object()?;
    Some(Usage {
        prompt_tokens: obj.get("prompt_tokens")?.as_u64()?,
        completion_tokens: obj
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_and_content_both_count_as_tokens_and_usage_is_kept() {
        let mut r = RequestRecord::default();
        assert!(!apply_event(
            &mut r,
            r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
            0.1
        ));
        assert!(r.t_first_s.is_none());
        apply_event(
            &mut r,
            r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
            0.5,
        );
        apply_event(
            &mut r,
            r#"{"choices":[{"delta":{"content":"ab"},"finish_reason":"length"}]}"#,
            0.9,
        );
        apply_event(
            &mut r,
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#,
            1.0,
        );
        assert!(apply_event(&mut r, "[DONE]", 1.1));
        assert_eq!(r.t_first_s, Some(0.5));
        assert_eq!(r.t_last_s, Some(0.9));
        assert_eq!((r.reasoning_chars, r.content_chars), (2, 2));
        assert_eq!(
            r.usage,
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 3,
                cached_tokens: Some(4)
            })
        );
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
        assert!(r.error.is_none());
    }

    #[test]
    fn error_event_and_bad_json_are_recorded() {
        let mut r = RequestRecord::default();
        apply_event(&mut r, r#"{"error":{"message":"boom"}}"#, 0.0);
        assert!(r.error.as_deref().unwrap().contains("boom"));
        let mut r = RequestRecord::default();
        apply_event(&mut r, "{not json", 0.0);
        assert!(r.error.as_deref().unwrap().contains("bad SSE JSON"));
    }
}
