//! Incremental Server-Sent Events parser: bytes in, `data` payloads out.

/// Splits a byte stream into SSE event payloads (the `data:` lines of each
/// event, joined by newlines). Accepts `\n` and `\r\n` line ends; ignores
/// comments and other fields.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl SseParser {
    /// Creates an empty parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; calls `on_event` for every complete event.
    pub fn push(&mut self, bytes: &[u8], mut on_event: impl FnMut(&[u8])) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(pos);
            rest = &tail[1..];
            if self.line.is_empty() {
                self.take_line(head, &mut on_event);
            } else {
                self.line.extend_from_slice(head);
                let line = std::mem::take(&mut self.line);
                self.take_line(&line, &mut on_event);
            }
        }
        self.line.extend_from_slice(rest);
    }

    /// Ends the stream: emits a last event that was not followed by a blank line.
    pub fn finish(&mut self, mut on_event: impl FnMut(&[u8])) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.take_line(&line, &mut on_event);
        }
        self.dispatch(&mut on_event);
    }

    fn take_line(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(on_event);
        } else if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(v);
            self.has_data = true;
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chunks(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, |e| out.push(String::from_utf8_lossy(e).into_owned()));
        }
        p.finish(|e| out.push(String::from_utf8_lossy(e).into_owned()));
        out
    }

    #[test]
    fn splits_events_across_chunk_boundaries() {
        let got = parse_chunks(&[b"data: {\"a\":", b"1}\n\ndata: [DO", b"NE]\n\n"]);
        assert_eq!(got, vec!["{\"a\":1}", "[DONE]"]);
    }

    #[test]
    fn crlf_comments_and_unterminated_tail() {
        let got =
            parse_chunks(&[b": ping\r\n\r\nevent: x\r\ndata:one\r\ndata: two\r\n\r\ndata: tail"]);
        assert_eq!(got, vec!["one\ntwo", "tail"]);
    }
}
