//! Server-sent events, split from a byte stream.

/// Server-sent events, split from a byte stream: calls back with each event's `data`.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// A parser with nothing buffered.
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds bytes; `on_event` gets the data of every complete event. Returns false on a
    /// line that is not UTF-8.
    pub fn feed(&mut self, bytes: &[u8], on_event: &mut dyn FnMut(&str)) -> bool {
        let mut ok = true;
        let mut rest: &[u8] = bytes;
        if !self.buf.is_empty() {
            // Complete the buffered partial line first.
            match rest.iter().position(|&b| b == b'\n') {
                None => {
                    self.buf.extend_from_slice(rest);
                    return true;
                }
                Some(i) => {
                    let mut line = std::mem::take(&mut self.buf);
                    line.extend_from_slice(&rest[..i]);
                    ok &= self.line(&line, on_event);
                    rest = &rest[i + 1..];
                }
            }
        }
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let (line, after) = (&rest[..i], &rest[i + 1..]);
            // Fast path for the usual shape, one `data:` line and a blank line in the same
            // read: hand the slice over without copying it.
            if !self.has_data
                && let Some(v) = data_value(line)
            {
                let blank = match after {
                    [b'\n', ..] => Some(1),
                    [b'\r', b'\n', ..] => Some(2),
                    _ => None,
                };
                if let Some(n) = blank {
                    match std::str::from_utf8(v) {
                        Ok(v) => on_event(v),
                        Err(_) => ok = false,
                    }
                    rest = &after[n..];
                    continue;
                }
            }
            ok &= self.line(line, on_event);
            rest = after;
        }
        self.buf.extend_from_slice(rest);
        ok
    }

    /// Ends the stream: dispatches an event that lacked its closing blank line.
    pub fn finish(&mut self, on_event: &mut dyn FnMut(&str)) -> bool {
        let mut ok = true;
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            ok = self.line(&line, on_event);
        }
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
        ok
    }

    fn line(&mut self, line: &[u8], on_event: &mut dyn FnMut(&str)) -> bool {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
                self.data.clear();
                self.has_data = false;
            }
            return true;
        }
        if line[0] == b':' {
            return true; // comment / keep-alive
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field != b"data" {
            return true; // event:, id:, retry: are not used by these APIs
        }
        let Ok(v) = std::str::from_utf8(value) else { return false };
        if self.has_data {
            self.data.push('\n');
        }
        self.data.push_str(v);
        self.has_data = true;
        true
    }
}

/// The value of a `data:` line (`data: x` or `data:x`, CR stripped).
fn data_value(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let v = line.strip_prefix(b"data:")?;
    Some(v.strip_prefix(b" ").unwrap_or(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for b in pieces {
            assert!(p.feed(b, &mut |d| out.push(d.to_string())));
        }
        assert!(p.finish(&mut |d| out.push(d.to_string())));
        out
    }

    #[test]
    fn sse_vllm_style() {
        let s = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n";
        assert_eq!(events(&[s]), vec!["{\"a\":1}", "{\"a\":2}", "[DONE]"]);
    }

    #[test]
    fn sse_split_anywhere_crlf_comments_no_space() {
        let s: &[u8] = b": ping\r\n\r\ndata:{\"a\":1}\r\n\r\nevent: message\r\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]";
        for cut in 0..s.len() {
            let (a, b) = s.split_at(cut);
            assert_eq!(events(&[a, b]), vec!["{\"a\":1}", "x\ny", "[DONE]"], "cut at {cut}");
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = s.chunks(1).collect();
        assert_eq!(events(&bytes), vec!["{\"a\":1}", "x\ny", "[DONE]"]);
    }
}
