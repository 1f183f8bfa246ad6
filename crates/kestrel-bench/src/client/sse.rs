//! Incremental Server-Sent Events parser: bytes in, complete `data` payloads out.
//!
//! Only the `data` field matters for OpenAI-compatible streams; `event`, `id`,
//! `retry` and comment lines are skipped. Lines end in LF, CRLF or CR, and a
//! blank line dispatches the event (multi-line data is joined with LF).

#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    last_was_cr: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; returns every event completed by them, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.last_was_cr && b == b'\n' {
                // Second half of a CRLF pair: the line already ended at CR.
                self.last_was_cr = false;
                continue;
            }
            self.last_was_cr = b == b'\r';
            if b == b'\n' || b == b'\r' {
                self.end_line(&mut events);
            } else {
                self.line.push(b);
            }
        }
        events
    }

    /// Flush an event left undispatched when the stream closed without a blank line.
    pub fn finish(&mut self) -> Option<String> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events);
        }
        self.end_line(&mut events);
        events.pop()
    }

    fn end_line(&mut self, events: &mut Vec<String>) {
        if self.line.is_empty() {
            if self.has_data {
                events.push(String::from_utf8_lossy(&self.data).into_owned());
            }
            self.data.clear();
            self.has_data = false;
            return;
        }
        let line = std::mem::take(&mut self.line);
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &b""[..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_arbitrary_chunk_boundaries() {
        let stream = b"data: {\"a\":1}\n\n: keepalive\n\ndata: {\"b\":2}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut p = SseParser::new();
            let mut got = p.push(&stream[..split]);
            got.extend(p.push(&stream[split..]));
            assert_eq!(
                got,
                vec!["{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"],
                "split {split}"
            );
        }
    }

    #[test]
    fn finish_flushes_unterminated_event() {
        let mut p = SseParser::new();
        assert!(p.push(b"data: tail").is_empty());
        assert_eq!(p.finish().as_deref(), Some("tail"));
        assert_eq!(p.finish(), None);
    }
}
