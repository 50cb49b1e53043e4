//! Protobuf-aware mutations: the input is parsed into a tree of fields (a length-delimited
//! field whose body parses completely is taken as a nested message), one field somewhere in
//! the tree is changed, and the tree is encoded again with correct lengths, unless the
//! mutation is a length edit, which writes a wrong one on purpose.

use crate::Rng;

/// The value of one field.
#[derive(Debug, Clone)]
pub enum Value {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    I64([u8; 8]),
    /// Wire type 5.
    I32([u8; 4]),
    /// Wire type 2 that is not a message.
    Bytes(Vec<u8>),
    /// Wire type 2 holding a message.
    Message(Vec<Field>),
}

/// One field of a message.
#[derive(Debug, Clone)]
pub struct Field {
    /// Field number.
    pub number: u64,
    /// Wire type as written (may disagree with the value after a tag mutation).
    pub wire: u8,
    /// The value.
    pub value: Value,
    /// Added to the encoded length of a length-delimited value (a length edit).
    pub len_delta: i64,
    /// Extra bytes of a non-minimal length varint (`0x80` continuation padding).
    pub len_pad: u8,
}

const MAX_DEPTH: usize = 24;

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Parses `buf` as a message; `None` when it is not one (to the last byte).
pub fn parse(buf: &[u8]) -> Option<Vec<Field>> {
    parse_at(buf, 0)
}

fn parse_at(buf: &[u8], depth: usize) -> Option<Vec<Field>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (number, wire) = (key >> 3, (key & 7) as u8);
        if number == 0 {
            return None;
        }
        let value = match wire {
            0 => Value::Varint(varint(buf, &mut pos)?),
            1 => {
                let b: [u8; 8] = buf.get(pos..pos + 8)?.try_into().ok()?;
                pos += 8;
                Value::I64(b)
            }
            5 => {
                let b: [u8; 4] = buf.get(pos..pos + 4)?.try_into().ok()?;
                pos += 4;
                Value::I32(b)
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let body = buf.get(pos..pos.checked_add(len)?)?;
                pos += len;
                match (depth < MAX_DEPTH && !body.is_empty()).then(|| parse_at(body, depth + 1)).flatten() {
                    Some(fields) if looks_like_message(body, &fields) => Value::Message(fields),
                    _ => Value::Bytes(body.to_vec()),
                }
            }
            _ => return None,
        };
        out.push(Field { number, wire, value, len_delta: 0, len_pad: 0 });
    }
    Some(out)
}

/// Printable text that happens to parse as protobuf is more likely a string.
fn looks_like_message(body: &[u8], fields: &[Field]) -> bool {
    let printable = body.iter().all(|b| b.is_ascii_graphic() || *b == b' ');
    !(printable && body.len() > 2) && fields.iter().all(|f| f.number < 1 << 16)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_len(out: &mut Vec<u8>, len: u64, pad: u8) {
    if pad == 0 {
        put_varint(out, len);
        return;
    }
    // A non-minimal varint: the same value with continuation bytes of zeros.
    let mut v = len;
    for _ in 0..pad {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    put_varint(out, v);
}

/// Encodes the fields.
pub fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(fields, &mut out);
    out
}

fn encode_into(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        put_varint(out, f.number << 3 | u64::from(f.wire & 7));
        match &f.value {
            Value::Varint(v) => put_varint(out, *v),
            Value::I64(b) => out.extend_from_slice(b),
            Value::I32(b) => out.extend_from_slice(b),
            Value::Bytes(b) => {
                put_len(out, (b.len() as i64).saturating_add(f.len_delta).max(0) as u64, f.len_pad);
                out.extend_from_slice(b);
            }
            Value::Message(m) => {
                let body = encode(m);
                put_len(out, (body.len() as i64).saturating_add(f.len_delta).max(0) as u64, f.len_pad);
                out.extend_from_slice(&body);
            }
        }
    }
}

/// Interesting varint values.
const VARINTS: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x3fff,
    0x4000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX - 1,
];

/// Paths (child indices from the root) of every field in the tree.
fn paths(fields: &[Field], prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    for (i, f) in fields.iter().enumerate() {
        prefix.push(i);
        out.push(prefix.clone());
        if let Value::Message(m) = &f.value {
            paths(m, prefix, out);
        }
        prefix.pop();
    }
}

/// The sibling list holding the field at `path`, and the field's index in it.
fn parent_of<'a>(root: &'a mut Vec<Field>, path: &[usize]) -> Option<(&'a mut Vec<Field>, usize)> {
    let (last, init) = path.split_last()?;
    let mut list = root;
    for &i in init {
        list = match &mut list.get_mut(i)?.value {
            Value::Message(m) => m,
            _ => return None,
        };
    }
    Some((list, *last))
}

/// Applies one protobuf-aware mutation to `input`; `None` when it does not parse as protobuf.
/// `other` is another corpus entry, for field transplants.
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    let mut root = parse(input)?;
    if root.is_empty() {
        return None;
    }
    let mut all = Vec::new();
    paths(&root, &mut Vec::new(), &mut all);
    let path = rng.pick(&all).clone();
    let donor = parse(other).map(|d| {
        let mut dp = Vec::new();
        paths(&d, &mut Vec::new(), &mut dp);
        (d, dp)
    });
    let (list, i) = parent_of(&mut root, &path)?;
    match rng.below(12) {
        // Length edits: off by a little, zero, huge, or written with padding.
        0 => {
            let f = &mut list[i];
            f.len_delta = *rng.pick(&[-2i64, -1, 1, 2, 8, 1 << 20, i64::MAX / 2, -(1 << 30)]);
        }
        1 => list[i].len_pad = 1 + rng.below(9) as u8,
        // Tag edits: another number (nearby, a sibling's, huge) or another wire type.
        2 => {
            let n = list[rng.below(list.len())].number;
            let f = &mut list[i];
            f.number = match rng.below(4) {
                0 => n,
                1 => f.number.saturating_add(1),
                2 => f.number.saturating_sub(1).max(1),
                _ => *rng.pick(&[1u64, 2, 15, 16, 2047, 0x1fff_ffff, 0x2000_0000]),
            };
        }
        3 => list[i].wire = *rng.pick(&[0u8, 1, 2, 3, 4, 5, 6, 7]),
        // Structure: duplicate, delete, swap siblings, repeat many times.
        4 => {
            let f = list[i].clone();
            list.insert(rng.below(list.len() + 1), f);
        }
        5 => {
            list.remove(i);
        }
        6 => {
            let j = rng.below(list.len());
            list.swap(i, j);
        }
        7 => {
            let f = list[i].clone();
            let n = 2 + rng.below(64);
            for _ in 0..n {
                list.insert(i, f.clone());
            }
        }
        // Values: interesting varints, id lengths off by one, invalid UTF-8.
        8 => match &mut list[i].value {
            Value::Varint(v) => *v = *rng.pick(VARINTS),
            Value::I64(b) => {
                *b = rng.pick(&[0u64, 1, u64::MAX, 0x7ff8_0000_0000_0000, 0x7ff0_0000_0000_0000]).to_le_bytes()
            }
            Value::I32(b) => *b = rng.pick(&[0u32, 1, u32::MAX, 0x7fc0_0000]).to_le_bytes(),
            Value::Bytes(b) => match rng.below(4) {
                0 => b.push(0),
                1 => {
                    b.pop();
                }
                2 => b.extend_from_slice(&[0xff, 0xfe, 0xc3]),
                _ => b.clear(),
            },
            Value::Message(m) => m.clear(),
        },
        // Nesting: wrap the field in copies of itself (deep recursion).
        9 => {
            let f = list[i].clone();
            if let Value::Message(_) = f.value {
                let mut cur = f;
                for _ in 0..1 + rng.below(120) {
                    let number = cur.number;
                    cur = Field { number, wire: 2, value: Value::Message(vec![cur]), len_delta: 0, len_pad: 0 };
                }
                list[i] = cur;
            }
        }
        // Transplant a field from another entry.
        10 => {
            if let Some((d, dp)) = &donor
                && !dp.is_empty()
            {
                let p = rng.pick(dp).clone();
                let mut d = d.clone();
                if let Some((dl, di)) = parent_of(&mut d, &p) {
                    let f = dl[di].clone();
                    list.insert(rng.below(list.len() + 1), f);
                }
            }
        }
        // An unknown field.
        _ => {
            let number = 100 + rng.below(1000) as u64;
            let value = match rng.below(3) {
                0 => Value::Varint(rng.next_u64()),
                1 => Value::Bytes(vec![0x08; rng.below(8)]),
                _ => Value::I32([1, 2, 3, 4]),
            };
            let wire = match value {
                Value::Varint(_) => 0,
                Value::I32(_) => 5,
                _ => 2,
            };
            list.insert(rng.below(list.len() + 1), Field { number, wire, value, len_delta: 0, len_pad: 0 });
        }
    }
    Some(encode(&root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_encode_round_trips() {
        // field 1: message { field 2: varint 150, field 3: "hi" }, field 4: fixed32
        let buf = [0x0a, 0x07, 0x10, 0x96, 0x01, 0x1a, 0x02, b'h', b'i', 0x25, 1, 2, 3, 4];
        let t = parse(&buf).unwrap();
        assert!(matches!(t[0].value, Value::Message(ref m) if m.len() == 2));
        assert_eq!(encode(&t), buf);
        assert!(parse(&[0x0a, 0x05, 0x01]).is_none());
    }

    #[test]
    fn mutations_are_deterministic_and_change_the_input() {
        let buf = [0x0a, 0x07, 0x10, 0x96, 0x01, 0x1a, 0x02, b'h', b'i', 0x25, 1, 2, 3, 4];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..50).filter_map(|_| mutate(&buf, &buf, &mut rng)).collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert!(a.iter().filter(|m| m.as_slice() != buf).count() > 25);
    }
}
