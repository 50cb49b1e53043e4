//! A parser for the subset of OTTL boolean expressions the `filter` processor evaluates.
//!
//! Grammar, loosest first (OTTL's precedence: `or` < `and` < `not` < comparison < `+ -` < `* /`):
//!
//! ```text
//! expr    := and ("or" and)*
//! and     := not ("and" not)*
//! not     := "not" not | cmp
//! cmp     := add (("==" | "!=" | "<" | "<=" | ">" | ">=") add)?
//! add     := mul (("+" | "-") mul)*
//! mul     := primary (("*" | "/") primary)*
//! primary := literal | ENUM | Converter "(" args ")" keys | path keys | "(" expr ")" | "[" values "]"
//! ```
//!
//! Columns in errors are 1-based character positions in the condition.

use std::fmt;

/// A syntax error at a column of the condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based character column.
    pub column: usize,
    /// What is wrong there.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column {}: {}", self.column, self.message)
    }
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Arithmetic operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MathOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
}

/// A literal value.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// `"text"`
    Str(String),
    /// `42`, `-1`
    Int(i64),
    /// `1.5`, `-.5`
    Float(f64),
    /// `true`, `false`
    Bool(bool),
    /// `nil`
    Nil,
    /// `0x01ab`
    Bytes(Vec<u8>),
}

/// An index after a path or converter: `["key"]` or `[0]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Key {
    /// A map key.
    Str(String),
    /// A list index.
    Int(i64),
}

/// A parsed expression with the column where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// 1-based column of the first character.
    pub col: usize,
    /// The expression.
    pub expr: Expr,
}

/// The syntax tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `a or b or ...`
    Or(Vec<Node>),
    /// `a and b and ...`
    And(Vec<Node>),
    /// `not a`
    Not(Box<Node>),
    /// `a OP b`
    Cmp(Box<Node>, CmpOp, Box<Node>),
    /// `a + b`, ...
    Math(Box<Node>, MathOp, Box<Node>),
    /// A literal.
    Lit(Literal),
    /// An uppercase identifier that is not called: an enum symbol.
    Enum(String),
    /// `seg.seg["key"][0]`
    Path {
        /// Dotted segments.
        segs: Vec<String>,
        /// Index keys after the segments.
        keys: Vec<Key>,
    },
    /// `Name(args)["key"]`
    Call {
        /// Function name.
        name: String,
        /// Arguments.
        args: Vec<Node>,
        /// Index keys after the call.
        keys: Vec<Key>,
    },
    /// `[a, b]`
    List(Vec<Node>),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Int(i64),
    Float(f64),
    Bytes(Vec<u8>),
    Ident(String),
    LParen,
    RParen,
    LBrack,
    RBrack,
    Comma,
    Dot,
    Cmp(CmpOp),
    Math(MathOp),
    Eof,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Int(i) => format!("number {i}"),
            Tok::Float(f) => format!("number {f}"),
            Tok::Bytes(_) => "a byte literal".into(),
            Tok::Ident(i) => format!("`{i}`"),
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::LBrack => "`[`".into(),
            Tok::RBrack => "`]`".into(),
            Tok::Comma => "`,`".into(),
            Tok::Dot => "`.`".into(),
            Tok::Cmp(_) => "a comparison operator".into(),
            Tok::Math(_) => "an arithmetic operator".into(),
            Tok::Eof => "the end of the condition".into(),
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    col: usize,
}

fn err<T>(col: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError { column: col, message: message.into() })
}

/// Splits a condition into tokens.
fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out: Vec<Token> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let prev_is_value = matches!(out.last().map(|t| &t.tok), Some(Tok::Ident(_) | Tok::RBrack | Tok::RParen));
        let single = match c {
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '[' => Some(Tok::LBrack),
            ']' => Some(Tok::RBrack),
            ',' => Some(Tok::Comma),
            '+' => Some(Tok::Math(MathOp::Add)),
            '-' => Some(Tok::Math(MathOp::Sub)),
            '*' => Some(Tok::Math(MathOp::Mul)),
            '/' => Some(Tok::Math(MathOp::Div)),
            '.' if prev_is_value || !chars.get(i + 1).is_some_and(char::is_ascii_digit) => Some(Tok::Dot),
            _ => None,
        };
        if let Some(tok) = single {
            out.push(Token { tok, col });
            i += 1;
            continue;
        }
        let next = chars.get(i + 1).copied();
        let two = match (c, next) {
            ('=', Some('=')) => Some(CmpOp::Eq),
            ('!', Some('=')) => Some(CmpOp::Ne),
            ('<', Some('=')) => Some(CmpOp::Le),
            ('>', Some('=')) => Some(CmpOp::Ge),
            _ => None,
        };
        if let Some(op) = two {
            out.push(Token { tok: Tok::Cmp(op), col });
            i += 2;
            continue;
        }
        match c {
            '<' | '>' => {
                out.push(Token { tok: Tok::Cmp(if c == '<' { CmpOp::Lt } else { CmpOp::Gt }), col });
                i += 1;
            }
            '=' => return err(col, "`=` is not an operator; use `==` to compare"),
            '!' => return err(col, "`!` is not an operator; use `not` to negate or `!=` to compare"),
            '&' | '|' => return err(col, format!("`{c}` is not an operator; use `and` / `or`")),
            '\'' => return err(col, "strings are written in double quotes (\"...\")"),
            '"' => {
                let mut s = String::new();
                let mut j = i + 1;
                loop {
                    match chars.get(j) {
                        None => return err(col, "unterminated string (missing closing `\"`)"),
                        Some('"') => break,
                        Some('\\') => {
                            let e = match chars.get(j + 1) {
                                Some('"') => '"',
                                Some('\\') => '\\',
                                Some('n') => '\n',
                                Some('t') => '\t',
                                Some('r') => '\r',
                                Some(other) => return err(j + 1, format!("unknown escape `\\{other}` in string")),
                                None => return err(col, "unterminated string (missing closing `\"`)"),
                            };
                            s.push(e);
                            j += 2;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            j += 1;
                        }
                    }
                }
                out.push(Token { tok: Tok::Str(s), col });
                i = j + 1;
            }
            '0' if matches!(next, Some('x' | 'X')) => {
                let mut j = i + 2;
                while chars.get(j).is_some_and(char::is_ascii_hexdigit) {
                    j += 1;
                }
                let hex: String = chars[i + 2..j].iter().collect();
                if hex.is_empty() || !hex.len().is_multiple_of(2) {
                    return err(col, "a byte literal needs an even, non-zero number of hex digits after `0x`");
                }
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|k| u8::from_str_radix(&hex[k..k + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| ParseError { column: col, message: "invalid hex digits".into() })?;
                out.push(Token { tok: Tok::Bytes(bytes), col });
                i = j;
            }
            c if c.is_ascii_digit() || c == '.' => {
                let mut j = i;
                let mut float = false;
                while let Some(&d) = chars.get(j) {
                    if d.is_ascii_digit() {
                        j += 1;
                    } else if d == '.' && !float {
                        float = true;
                        j += 1;
                    } else if (d == 'e' || d == 'E') && j > i {
                        float = true;
                        j += 1;
                        if matches!(chars.get(j), Some('+' | '-')) {
                            j += 1;
                        }
                    } else {
                        break;
                    }
                }
                let text: String = chars[i..j].iter().collect();
                let tok = if float {
                    match text.parse::<f64>() {
                        Ok(f) => Tok::Float(f),
                        Err(_) => return err(col, format!("invalid number `{text}`")),
                    }
                } else {
                    match text.parse::<i64>() {
                        Ok(v) => Tok::Int(v),
                        Err(_) => return err(col, format!("integer `{text}` does not fit in 64 bits")),
                    }
                };
                if chars.get(j).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                    return err(j + 1, format!("unexpected `{}` after number", chars[j]));
                }
                out.push(Token { tok, col });
                i = j;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut j = i;
                while chars.get(j).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_') {
                    j += 1;
                }
                out.push(Token { tok: Tok::Ident(chars[i..j].iter().collect()), col });
                i = j;
            }
            other => return err(col, format!("unexpected character `{other}`")),
        }
    }
    out.push(Token { tok: Tok::Eof, col: chars.len() + 1 });
    Ok(out)
}

/// Parses one condition.
pub fn parse(src: &str) -> Result<Node, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { toks, pos: 0, depth: 0 };
    if matches!(p.peek(), Tok::Eof) {
        return err(1, "empty condition");
    }
    let n = p.expr()?;
    match p.peek() {
        Tok::Eof => Ok(n),
        t => {
            let hint = match t {
                Tok::Ident(w) if w.eq_ignore_ascii_case("and") || w.eq_ignore_ascii_case("or") => {
                    format!(" (OTTL keywords are lowercase: `{}`)", w.to_ascii_lowercase())
                }
                _ => String::new(),
            };
            err(p.col(), format!("unexpected {} after a complete condition{hint}", t.describe()))
        }
    }
}

/// Deepest nesting accepted (a bound on recursion for hostile configs).
const MAX_DEPTH: usize = 64;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }
    fn col(&self) -> usize {
        self.toks[self.pos.min(self.toks.len() - 1)].col
    }
    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos.min(self.toks.len() - 1)].clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }
    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Tok::Ident(i) if i == w)
    }
    fn expect(&mut self, want: Tok, what: &str) -> Result<(), ParseError> {
        if *self.peek() == want {
            self.bump();
            Ok(())
        } else {
            err(self.col(), format!("expected {what}, found {}", self.peek().describe()))
        }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err(self.col(), format!("condition nested more than {MAX_DEPTH} levels deep"));
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Node, ParseError> {
        self.enter()?;
        let first = self.and()?;
        let col = first.col;
        let mut parts = vec![first];
        while self.is_word("or") {
            self.bump();
            parts.push(self.and()?);
        }
        self.depth -= 1;
        Ok(if parts.len() == 1 { parts.remove(0) } else { Node { col, expr: Expr::Or(parts) } })
    }

    fn and(&mut self) -> Result<Node, ParseError> {
        let first = self.not()?;
        let col = first.col;
        let mut parts = vec![first];
        while self.is_word("and") {
            self.bump();
            parts.push(self.not()?);
        }
        Ok(if parts.len() == 1 { parts.remove(0) } else { Node { col, expr: Expr::And(parts) } })
    }

    fn not(&mut self) -> Result<Node, ParseError> {
        if self.is_word("not") {
            let col = self.bump().col;
            self.enter()?;
            let inner = self.not()?;
            self.depth -= 1;
            return Ok(Node { col, expr: Expr::Not(Box::new(inner)) });
        }
        self.cmp()
    }

    fn cmp(&mut self) -> Result<Node, ParseError> {
        let left = self.add()?;
        if let Tok::Cmp(op) = *self.peek() {
            self.bump();
            let right = self.add()?;
            if let Tok::Cmp(_) = self.peek() {
                return err(self.col(), "comparisons cannot be chained; join them with `and`");
            }
            let col = left.col;
            return Ok(Node { col, expr: Expr::Cmp(Box::new(left), op, Box::new(right)) });
        }
        Ok(left)
    }

    fn add(&mut self) -> Result<Node, ParseError> {
        let mut left = self.mul()?;
        // Each operator nests the tree one level deeper: bounded like parentheses.
        let mut ops = 0;
        while let Tok::Math(op @ (MathOp::Add | MathOp::Sub)) = *self.peek() {
            self.enter()?;
            ops += 1;
            self.bump();
            let right = self.mul()?;
            let col = left.col;
            left = Node { col, expr: Expr::Math(Box::new(left), op, Box::new(right)) };
        }
        self.depth -= ops;
        Ok(left)
    }

    fn mul(&mut self) -> Result<Node, ParseError> {
        let mut left = self.primary()?;
        // Each operator nests the tree one level deeper: bounded like parentheses.
        let mut ops = 0;
        while let Tok::Math(op @ (MathOp::Mul | MathOp::Div)) = *self.peek() {
            self.enter()?;
            ops += 1;
            self.bump();
            let right = self.primary()?;
            let col = left.col;
            left = Node { col, expr: Expr::Math(Box::new(left), op, Box::new(right)) };
        }
        self.depth -= ops;
        Ok(left)
    }

    fn keys(&mut self) -> Result<Vec<Key>, ParseError> {
        let mut keys = Vec::new();
        while *self.peek() == Tok::LBrack {
            self.bump();
            let col = self.col();
            let key = match self.bump().tok {
                Tok::Str(s) => Key::Str(s),
                Tok::Int(i) => Key::Int(i),
                t => return err(col, format!("expected a string key or an integer index, found {}", t.describe())),
            };
            self.expect(Tok::RBrack, "`]` after the key")?;
            keys.push(key);
        }
        Ok(keys)
    }

    fn primary(&mut self) -> Result<Node, ParseError> {
        let t = self.bump();
        let col = t.col;
        let lit = |l| Ok(Node { col, expr: Expr::Lit(l) });
        match t.tok {
            Tok::Str(s) => lit(Literal::Str(s)),
            Tok::Int(i) => lit(Literal::Int(i)),
            Tok::Float(f) => lit(Literal::Float(f)),
            Tok::Bytes(b) => lit(Literal::Bytes(b)),
            Tok::Math(sign @ (MathOp::Add | MathOp::Sub)) => {
                let neg = sign == MathOp::Sub;
                match self.peek().clone() {
                    Tok::Int(i) => {
                        self.bump();
                        lit(Literal::Int(if neg { i.wrapping_neg() } else { i }))
                    }
                    Tok::Float(f) => {
                        self.bump();
                        lit(Literal::Float(if neg { -f } else { f }))
                    }
                    other => err(col, format!("a sign must be followed by a number, found {}", other.describe())),
                }
            }
            Tok::LParen => {
                let inner = self.expr()?;
                self.expect(Tok::RParen, "`)`")?;
                Ok(inner)
            }
            Tok::LBrack => {
                self.enter()?;
                let mut items = Vec::new();
                if *self.peek() != Tok::RBrack {
                    loop {
                        items.push(self.expr()?);
                        if *self.peek() == Tok::Comma {
                            self.bump();
                            continue;
                        }
                        break;
                    }
                }
                self.expect(Tok::RBrack, "`]` or `,` in the list")?;
                self.depth -= 1;
                Ok(Node { col, expr: Expr::List(items) })
            }
            Tok::Ident(w) => match w.as_str() {
                "true" => lit(Literal::Bool(true)),
                "false" => lit(Literal::Bool(false)),
                "nil" => lit(Literal::Nil),
                "and" | "or" | "not" => err(col, format!("expected a value before `{w}`")),
                _ if w.starts_with(|c: char| c.is_ascii_uppercase()) => {
                    if *self.peek() != Tok::LParen {
                        return Ok(Node { col, expr: Expr::Enum(w) });
                    }
                    self.bump();
                    self.enter()?;
                    let mut args = Vec::new();
                    if *self.peek() != Tok::RParen {
                        loop {
                            args.push(self.expr()?);
                            if *self.peek() == Tok::Comma {
                                self.bump();
                                continue;
                            }
                            break;
                        }
                    }
                    self.expect(Tok::RParen, "`)` or `,` in the arguments")?;
                    self.depth -= 1;
                    let keys = self.keys()?;
                    Ok(Node { col, expr: Expr::Call { name: w, args, keys } })
                }
                _ => {
                    if *self.peek() == Tok::LParen {
                        return err(
                            col,
                            format!(
                                "`{w}` is an editor (lowercase); a condition can only call converters, whose names start with an uppercase letter"
                            ),
                        );
                    }
                    let mut segs = vec![w];
                    while *self.peek() == Tok::Dot {
                        self.bump();
                        let c = self.col();
                        match self.bump().tok {
                            Tok::Ident(s) => segs.push(s),
                            t => return err(c, format!("expected a field name after `.`, found {}", t.describe())),
                        }
                    }
                    let keys = self.keys()?;
                    Ok(Node { col, expr: Expr::Path { segs, keys } })
                }
            },
            other => err(col, format!("expected a value, found {}", other.describe())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: &Node) -> String {
        match &n.expr {
            Expr::Or(v) => format!("or({})", v.iter().map(shape).collect::<Vec<_>>().join(",")),
            Expr::And(v) => format!("and({})", v.iter().map(shape).collect::<Vec<_>>().join(",")),
            Expr::Not(x) => format!("not({})", shape(x)),
            Expr::Cmp(a, op, b) => format!("{}{op:?}{}", shape(a), shape(b)),
            Expr::Math(a, op, b) => format!("({}{op:?}{})", shape(a), shape(b)),
            Expr::Lit(l) => format!("{l:?}"),
            Expr::Enum(e) => e.clone(),
            Expr::Path { segs, keys } => format!("{}{keys:?}", segs.join(".")),
            Expr::Call { name, args, .. } => {
                format!("{name}({})", args.iter().map(shape).collect::<Vec<_>>().join(","))
            }
            Expr::List(v) => format!("[{}]", v.iter().map(shape).collect::<Vec<_>>().join(",")),
        }
    }

    #[test]
    fn precedence_of_or_and_not() {
        assert_eq!(
            shape(&parse("a == 1 or b == 2 and c == 3").unwrap()),
            "or(a[]EqInt(1),and(b[]EqInt(2),c[]EqInt(3)))"
        );
        assert_eq!(
            shape(&parse("(a == 1 or b == 2) and c == 3").unwrap()),
            "and(or(a[]EqInt(1),b[]EqInt(2)),c[]EqInt(3))"
        );
        assert_eq!(shape(&parse("not a == 1 and true").unwrap()), "and(not(a[]EqInt(1)),Bool(true))");
        assert_eq!(shape(&parse("not not false").unwrap()), "not(not(Bool(false)))");
    }

    #[test]
    fn math_precedence_and_signed_literals() {
        assert_eq!(shape(&parse("a - 1 * -2 > .5").unwrap()), "(a[]Sub(Int(1)MulInt(-2)))GtFloat(0.5)");
        assert_eq!(shape(&parse("(a + 1) * 2 == 4").unwrap()), "((a[]AddInt(1))MulInt(2))EqInt(4)");
    }

    #[test]
    fn paths_keys_calls_and_enums() {
        let n = parse(r#"resource.attributes["k8s.pod.name"]["x"][0] != nil"#).unwrap();
        assert_eq!(shape(&n), r#"resource.attributes[Str("k8s.pod.name"), Str("x"), Int(0)]NeNil"#);
        let n = parse(r#"IsMatch(name, "^GET /h.*") and kind == SPAN_KIND_SERVER"#).unwrap();
        assert_eq!(shape(&n), r#"and(IsMatch(name[],Str("^GET /h.*")),kind[]EqSPAN_KIND_SERVER)"#);
        assert_eq!(shape(&parse(r#"body == "a \"q\" \\ b""#).unwrap()), r#"body[]EqStr("a \"q\" \\ b")"#);
        assert_eq!(shape(&parse("trace_id == 0x00ff").unwrap()), "trace_id[]EqBytes([0, 255])");
    }

    #[test]
    fn errors_carry_the_column() {
        let e = parse(r#"attributes["a" == 1"#).unwrap_err();
        assert_eq!(e.column, 16, "{e}");
        assert!(e.message.contains("`]`"), "{e}");
        assert_eq!(parse(r#"name = "x""#).unwrap_err().column, 6);
        assert_eq!(parse(r#"name == "x" AND kind == 1"#).unwrap_err().column, 13);
        assert_eq!(parse(r#"name == "x"#).unwrap_err().column, 9);
        assert_eq!(parse("a == 1 ==  2").unwrap_err().column, 8);
        assert_eq!(parse("").unwrap_err().column, 1);
        assert_eq!(parse("(a == 1").unwrap_err().column, 8);
        assert_eq!(parse("a == 99999999999999999999").unwrap_err().column, 6);
        assert_eq!(parse("set(name, 1)").unwrap_err().column, 1);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}true{}", "(".repeat(200), ")".repeat(200));
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
        let nots = format!("{}true", "not ".repeat(200));
        assert!(parse(&nots).is_err());
        let sum = format!("1{} == 2", " + 1".repeat(200));
        assert!(parse(&sum).unwrap_err().message.contains("nested"));
        assert!(parse(&format!("1{} == 2", " + 1".repeat(20))).is_ok());
    }
}
