//! A pipeline result as an MCP tool result: `structuredContent` holds the
//! whole result (its tool's output schema says what), and one short text
//! block says what happened in words, instead of the same JSON again, so
//! that a large plan does not cost its tokens twice.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

use gateway_core::pipeline::{CallResult, Outcome};

/// The words of the text block.
pub fn text(r: &CallResult) -> (String, bool) {
    match &r.outcome {
        Outcome::Denied { violations, .. } if !violations.is_empty() => {
            let mut t = format!("Invalid arguments for {}:", r.tool);
            for v in violations {
                t.push_str(&format!("\n- {}", v.message));
            }
            (t, true)
        }
        Outcome::Denied { reasons, .. } => {
            (format!("Denied by policy: {}", reasons.join("; ")), true)
        }
        Outcome::Refused { reason } => (format!("Refused: {reason}"), true),
        Outcome::PendingApproval {
            approval_id,
            signals,
            approve_command,
            review_url,
            ..
        } => {
            let page = review_url
                .as_ref()
                .map(|u| format!("Show your user this link to review and approve it: {u} . "))
                .unwrap_or_default();
            let mut t = format!(
                "Not applied: this call needs a person's approval (approval id {approval_id}). {page}\
                 An operator reviews it with `gateway approvals show {approval_id}` and approves it with `{approve_command}`; \
                 then call {} again with approval_id {approval_id}.",
                r.tool
            );
            for s in signals.as_array().into_iter().flatten() {
                t.push_str(&format!("\n!! {}", s["message"].as_str().unwrap_or("")));
            }
            (t, false)
        }
        Outcome::Completed { ok, summary, .. } => (summary.clone(), !ok),
    }
}

/// The tool result: the text, the structured result, `isError` for
/// denials, refusals and failures, the request id in `_meta`.
pub fn to_result(r: &CallResult) -> CallToolResult {
    let structured = serde_json::to_value(r).unwrap_or(Value::Null);
    let (text, is_error) = text(r);
    let mut result = if is_error {
        CallToolResult::structured_error(structured)
    } else {
        CallToolResult::structured(structured)
    };
    result.content = vec![ContentBlock::text(text)];
    let mut meta = rmcp::model::MetaObject::default();
    meta.insert("request_id".into(), Value::String(r.request_id.clone()));
    result.with_meta(Some(meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_text_block_is_words_not_the_json_again() {
        let r = CallResult {
            request_id: "req-1".into(),
            tool: "terraform_plan".into(),
            outcome: Outcome::Completed {
                ok: true,
                summary: "Plan: 1 to add.".into(),
                result: json!({"changes": [{"address": "a".repeat(5000)}]}),
            },
        };
        let out = to_result(&r);
        assert_eq!(out.content.len(), 1);
        let wire = serde_json::to_value(&out).unwrap_or_default();
        assert_eq!(wire["content"][0]["text"], "Plan: 1 to add.");
        assert_eq!(wire["structuredContent"]["status"], "completed");
        assert_eq!(wire["isError"], false);
        assert_eq!(wire["_meta"]["request_id"], "req-1");
    }

    #[test]
    fn a_refusal_is_an_error_result() {
        let r = CallResult {
            request_id: "req-2".into(),
            tool: "terraform_apply".into(),
            outcome: Outcome::Refused {
                reason: "approval x was denied".into(),
            },
        };
        let wire = serde_json::to_value(to_result(&r)).unwrap_or_default();
        assert_eq!(wire["isError"], true);
        assert_eq!(wire["content"][0]["text"], "Refused: approval x was denied");
    }
}
