//! A reader for protobuf's text format, the syntax of Triton's `config.pbtxt`, into an
//! untyped tree of [`Message`]s. It knows no schema: [`super::config`] gives the fields
//! their meaning.
//!
//! Accepted: `name: scalar` (integers in decimal or hex, negative too; floats, with an
//! exponent, an `f` suffix, `inf` and `nan`; strings in `"…"` or `'…'` with C escapes,
//! adjacent strings joined; identifiers, which are enum values and booleans); nested
//! messages as `name { … }` or `name < … >`, the `:` before them optional; repeated
//! fields as repeated entries or as lists `name: [a, b]` (of scalars or messages);
//! `#` comments to the end of the line; a `,` or `;` after any field.
//!
//! Every value keeps its line and column so the schema's errors can point at it, and
//! every error names the file, the line and the column, and says what was expected.

use std::fmt;

/// Deepest nesting of messages and lists a file may use, so that a hostile file cannot
/// overflow the stack.
pub const MAX_DEPTH: usize = 64;

/// Where something is in a file: 1-based line and column (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1, in characters.
    pub column: u32,
}

/// Why a text-format file was refused: the file, where in it, and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ParseError {
    /// The file (as the caller named it).
    pub file: String,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub column: u32,
    /// What was expected, or what is wrong.
    pub message: String,
}

impl ParseError {
    /// An error at `pos` in `file`.
    pub fn at(file: &str, pos: Pos, message: impl Into<String>) -> ParseError {
        ParseError { file: file.into(), line: pos.line, column: pos.column, message: message.into() }
    }
}

/// A message: its fields in file order. A repeated field appears once per value.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    /// The fields, in the order written; list elements are flattened into entries.
    pub fields: Vec<Field>,
}

/// One field entry: `name` and one value.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The field name as written.
    pub name: String,
    /// Where the name is.
    pub pos: Pos,
    /// The value.
    pub value: Value,
    /// Where the value starts.
    pub value_pos: Pos,
}

/// A field's value, untyped.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An integer literal (wide enough for both `int64` and `uint64`).
    Int(i128),
    /// A floating-point literal (or `inf`, `nan`).
    Float(f64),
    /// A string literal, escapes resolved (must be UTF-8).
    Str(String),
    /// A bare identifier: an enum value, or `true` / `false`.
    Ident(String),
    /// A nested message.
    Message(Message),
}

impl Value {
    /// What kind of value this is, for error messages ("a string", "a message", …).
    pub fn describe(&self) -> String {
        match self {
            Value::Int(i) => format!("the integer {i}"),
            Value::Float(f) => format!("the number {f}"),
            Value::Str(s) => format!("the string {s:?}"),
            Value::Ident(i) => format!("the identifier {i}"),
            Value::Message(_) => "a message".into(),
        }
    }
}

/// Parse a whole file. `file` is the name used in errors.
pub fn parse(text: &str, file: &str) -> Result<Message, ParseError> {
    let mut parser = Parser { lexer: Lexer::new(text, file), file, peeked: None };
    let message = parser.message(None, 0)?;
    Ok(message)
}

/// A lexical token.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i128),
    Float(f64),
    Str(Vec<u8>),
    Punct(char),
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(i) => write!(f, "`{i}`"),
            Tok::Int(i) => write!(f, "the number {i}"),
            Tok::Float(x) => write!(f, "the number {x}"),
            Tok::Str(_) => write!(f, "a string"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::End => write!(f, "the end of the file"),
        }
    }
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    file: &'a str,
    line: u32,
    column: u32,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str, file: &'a str) -> Self {
        Lexer { chars: text.chars().peekable(), file, line: 1, column: 1 }
    }

    fn pos(&self) -> Pos {
        Pos { line: self.line, column: self.column }
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn error(&self, pos: Pos, message: impl Into<String>) -> ParseError {
        ParseError::at(self.file, pos, message)
    }

    /// The next token and where it starts.
    fn next(&mut self) -> Result<(Tok, Pos), ParseError> {
        loop {
            match self.chars.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => {
                    while self.chars.peek().is_some_and(|&c| c != '\n') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
        let pos = self.pos();
        let Some(&c) = self.chars.peek() else { return Ok((Tok::End, pos)) };
        let tok = match c {
            '{' | '}' | '<' | '>' | '[' | ']' | ':' | ',' | ';' | '-' => {
                self.bump();
                Tok::Punct(c)
            }
            '"' | '\'' => Tok::Str(self.string(pos)?),
            c if c.is_ascii_digit() || c == '.' => self.number(pos)?,
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut ident = String::new();
                while let Some(&c) = self.chars.peek().filter(|c| c.is_ascii_alphanumeric() || **c == '_') {
                    ident.push(c);
                    self.bump();
                }
                Tok::Ident(ident)
            }
            other => return Err(self.error(pos, format!("unexpected character {other:?}; expected a field name, a value or punctuation"))),
        };
        Ok((tok, pos))
    }

    fn number(&mut self, pos: Pos) -> Result<Tok, ParseError> {
        let mut text = String::new();
        while let Some(&c) = self.chars.peek() {
            let exponent_sign = (c == '+' || c == '-') && text.ends_with(['e', 'E']) && !text.starts_with("0x");
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || exponent_sign {
                text.push(c);
                self.bump();
            } else {
                break;
            }
        }
        let bad = || ParseError::at(self.file, pos, format!("malformed number `{text}`"));
        if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            return i128::from_str_radix(hex, 16).map(Tok::Int).map_err(|_| bad());
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            if text.len() > 1 && text.starts_with('0') {
                // Protobuf reads a leading 0 as octal; refuse rather than guess.
                return Err(self.error(pos, format!("`{text}`: octal numbers are not accepted; write it in decimal")));
            }
            return text.parse().map(Tok::Int).map_err(|_| self.error(pos, format!("the integer `{text}` is too large")));
        }
        let float = text.strip_suffix(['f', 'F']).unwrap_or(&text);
        if float.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
            if let Ok(x) = float.parse::<f64>() {
                return Ok(Tok::Float(x));
            }
        }
        Err(bad())
    }

    fn string(&mut self, pos: Pos) -> Result<Vec<u8>, ParseError> {
        let quote = self.bump().expect("called on a quote");
        let mut out = Vec::new();
        loop {
            let here = self.pos();
            match self.bump() {
                None | Some('\n') => return Err(self.error(pos, format!("string not closed: expected {quote} before the end of the line"))),
                Some(c) if c == quote => return Ok(out),
                Some('\\') => self.escape(here, &mut out)?,
                Some(c) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
    }

    /// One escape after a backslash at `pos`, appended to `out`.
    fn escape(&mut self, pos: Pos, out: &mut Vec<u8>) -> Result<(), ParseError> {
        let Some(c) = self.bump() else { return Err(self.error(pos, "expected an escape after `\\`")) };
        let simple = match c {
            'n' => Some(b'\n'),
            't' => Some(b'\t'),
            'r' => Some(b'\r'),
            'a' => Some(0x07),
            'b' => Some(0x08),
            'f' => Some(0x0c),
            'v' => Some(0x0b),
            '\\' => Some(b'\\'),
            '\'' => Some(b'\''),
            '"' => Some(b'"'),
            '?' => Some(b'?'),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            return Ok(());
        }
        match c {
            '0'..='7' => {
                let mut value = c.to_digit(8).unwrap();
                for _ in 0..2 {
                    match self.chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            value = value * 8 + d;
                            self.bump();
                        }
                        None => break,
                    }
                }
                let byte = u8::try_from(value).map_err(|_| self.error(pos, format!("octal escape \\{value:o} is over \\377")))?;
                out.push(byte);
            }
            'x' | 'X' => {
                let value = self.hex_digits(pos, 1, 2)?;
                out.push(value as u8);
            }
            'u' | 'U' => {
                let digits = if c == 'u' { 4 } else { 8 };
                let value = self.hex_digits(pos, digits, digits)?;
                let ch = char::from_u32(value).ok_or_else(|| self.error(pos, format!("\\{c}{value:x} is not a Unicode scalar value")))?;
                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
            }
            other => {
                return Err(
                    self.error(pos, format!("unknown escape `\\{other}`; expected one of \\n \\t \\r \\\\ \\' \\\" \\xHH \\NNN \\uHHHH"))
                )
            }
        }
        Ok(())
    }

    fn hex_digits(&mut self, pos: Pos, min: usize, max: usize) -> Result<u32, ParseError> {
        let mut value = 0u32;
        let mut n = 0;
        while n < max {
            match self.chars.peek().and_then(|c| c.to_digit(16)) {
                Some(d) => {
                    value = value * 16 + d;
                    n += 1;
                    self.bump();
                }
                None => break,
            }
        }
        if n < min {
            return Err(self.error(pos, format!("expected {min} hex digit(s) in the escape")));
        }
        Ok(value)
    }
}

struct Parser<'a> {
    lexer: Lexer<'a>,
    file: &'a str,
    peeked: Option<(Tok, Pos)>,
}

impl Parser<'_> {
    fn peek(&mut self) -> Result<&(Tok, Pos), ParseError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lexer.next()?);
        }
        Ok(self.peeked.as_ref().unwrap())
    }

    fn next(&mut self) -> Result<(Tok, Pos), ParseError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lexer.next(),
        }
    }

    fn error(&self, pos: Pos, message: impl Into<String>) -> ParseError {
        ParseError::at(self.file, pos, message)
    }

    /// Fields until `close` (or the end of the file when `close` is `None`), consuming it.
    fn message(&mut self, close: Option<char>, depth: usize) -> Result<Message, ParseError> {
        let mut message = Message::default();
        loop {
            let (tok, pos) = self.next()?;
            match tok {
                Tok::End if close.is_none() => return Ok(message),
                Tok::End => {
                    return Err(self.error(pos, format!("expected `{}` to close the message, found the end of the file", close.unwrap())))
                }
                Tok::Punct(c) if Some(c) == close => return Ok(message),
                Tok::Ident(name) => self.field(name, pos, &mut message, depth)?,
                other => {
                    let closing = close.map(|c| format!(" or `{c}`")).unwrap_or_default();
                    return Err(self.error(pos, format!("expected a field name{closing}, found {other}")));
                }
            }
            if let (Tok::Punct(',' | ';'), _) = self.peek()? {
                self.next()?;
            }
        }
    }

    /// The rest of a field after its name: values appended to `message`.
    fn field(&mut self, name: String, pos: Pos, message: &mut Message, depth: usize) -> Result<(), ParseError> {
        let colon = matches!(self.peek()?, (Tok::Punct(':'), _));
        if colon {
            self.next()?;
        }
        let (tok, value_pos) = self.peek()?.clone();
        match tok {
            Tok::Punct('[') => {
                self.next()?;
                self.list(&name, pos, message, depth)
            }
            Tok::Punct('{' | '<') => {
                let value = self.nested(depth)?;
                message.fields.push(Field { name, pos, value, value_pos });
                Ok(())
            }
            _ if !colon => Err(self.error(value_pos, format!("expected `:` after the field name `{name}`, found {tok}"))),
            _ => {
                let value = self.scalar(&name)?;
                message.fields.push(Field { name, pos, value, value_pos });
                Ok(())
            }
        }
    }

    /// A `{ … }` or `< … >` message at the next token.
    fn nested(&mut self, depth: usize) -> Result<Value, ParseError> {
        let (tok, pos) = self.next()?;
        if depth + 1 > MAX_DEPTH {
            return Err(self.error(pos, format!("messages and lists nested deeper than {MAX_DEPTH} levels")));
        }
        let close = if tok == Tok::Punct('{') { '}' } else { '>' };
        Ok(Value::Message(self.message(Some(close), depth + 1)?))
    }

    /// The elements of a `[ … ]` list after its `[`, consuming the `]`.
    fn list(&mut self, name: &str, pos: Pos, message: &mut Message, depth: usize) -> Result<(), ParseError> {
        if depth + 1 > MAX_DEPTH {
            return Err(self.error(pos, format!("messages and lists nested deeper than {MAX_DEPTH} levels")));
        }
        if let (Tok::Punct(']'), _) = self.peek()? {
            self.next()?;
            return Ok(());
        }
        loop {
            let (tok, value_pos) = self.peek()?.clone();
            let value = match tok {
                Tok::Punct('{' | '<') => self.nested(depth + 1)?,
                _ => self.scalar(name)?,
            };
            message.fields.push(Field { name: name.into(), pos, value, value_pos });
            let (tok, at) = self.next()?;
            match tok {
                Tok::Punct(',') => continue,
                Tok::Punct(']') => return Ok(()),
                other => return Err(self.error(at, format!("expected `,` or `]` in the list `{name}`, found {other}"))),
            }
        }
    }

    /// A scalar value for field `name`.
    fn scalar(&mut self, name: &str) -> Result<Value, ParseError> {
        let (tok, pos) = self.next()?;
        match tok {
            Tok::Int(i) => Ok(Value::Int(i)),
            Tok::Float(x) => Ok(Value::Float(x)),
            Tok::Ident(i) => Ok(match i.as_str() {
                "inf" | "infinity" => Value::Float(f64::INFINITY),
                "nan" => Value::Float(f64::NAN),
                _ => Value::Ident(i),
            }),
            Tok::Str(mut bytes) => {
                // Adjacent strings are one string, as in C.
                while let (Tok::Str(_), _) = self.peek()? {
                    let Tok::Str(more) = self.next()?.0 else { unreachable!() };
                    bytes.extend(more);
                }
                String::from_utf8(bytes).map(Value::Str).map_err(|_| self.error(pos, format!("the string for `{name}` is not valid UTF-8")))
            }
            Tok::Punct('-') => {
                let (tok, at) = self.next()?;
                match tok {
                    Tok::Int(i) => Ok(Value::Int(-i)),
                    Tok::Float(x) => Ok(Value::Float(-x)),
                    Tok::Ident(i) if i == "inf" || i == "infinity" => Ok(Value::Float(f64::NEG_INFINITY)),
                    other => Err(self.error(at, format!("expected a number after `-` for `{name}`, found {other}"))),
                }
            }
            other => Err(self.error(pos, format!("expected a value for `{name}`, found {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Message {
        parse(text, "config.pbtxt").unwrap_or_else(|e| panic!("{e}"))
    }

    /// The error for `text`: (line, column, message).
    fn err(text: &str) -> (u32, u32, String) {
        let e = parse(text, "m/config.pbtxt").expect_err("should be refused");
        assert_eq!(e.file, "m/config.pbtxt");
        assert!(e.to_string().starts_with(&format!("m/config.pbtxt:{}:{}: ", e.line, e.column)), "{e}");
        (e.line, e.column, e.message)
    }

    fn values<'a>(m: &'a Message, name: &str) -> Vec<&'a Value> {
        m.fields.iter().filter(|f| f.name == name).map(|f| &f.value).collect()
    }

    fn sub<'a>(m: &'a Message, name: &str) -> &'a Message {
        match values(m, name).first() {
            Some(Value::Message(m)) => m,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn scalars_of_every_kind() {
        let m = ok(r#"a: 8 b: -3 c: 0x1F d: 2.5 e: -1e-3 f: .5 g: 1.5f h: true i: KIND_GPU j: "x" k: 'y' l: 18446744073709551615 m: -inf"#);
        assert_eq!(values(&m, "a"), [&Value::Int(8)]);
        assert_eq!(values(&m, "b"), [&Value::Int(-3)]);
        assert_eq!(values(&m, "c"), [&Value::Int(31)]);
        assert_eq!(values(&m, "d"), [&Value::Float(2.5)]);
        assert_eq!(values(&m, "e"), [&Value::Float(-1e-3)]);
        assert_eq!(values(&m, "f"), [&Value::Float(0.5)]);
        assert_eq!(values(&m, "g"), [&Value::Float(1.5)]);
        assert_eq!(values(&m, "h"), [&Value::Ident("true".into())]);
        assert_eq!(values(&m, "i"), [&Value::Ident("KIND_GPU".into())]);
        assert_eq!(values(&m, "j"), [&Value::Str("x".into())]);
        assert_eq!(values(&m, "k"), [&Value::Str("y".into())]);
        assert_eq!(values(&m, "l"), [&Value::Int(u64::MAX as i128)]);
        assert_eq!(values(&m, "m"), [&Value::Float(f64::NEG_INFINITY)]);
    }

    #[test]
    fn string_escapes_and_joining() {
        let m = ok(r#"s: "a\"b\n\t\\\x41\101\u00e9" t: 'it\'s "fine"' u: "con" 'cat' v: "é""#);
        assert_eq!(values(&m, "s"), [&Value::Str("a\"b\n\t\\AAé".into())]);
        assert_eq!(values(&m, "t"), [&Value::Str("it's \"fine\"".into())]);
        assert_eq!(values(&m, "u"), [&Value::Str("concat".into())]);
        assert_eq!(values(&m, "v"), [&Value::Str("é".into())]);
    }

    #[test]
    fn messages_lists_comments_and_separators() {
        let text = "# a comment\n\
            outer { inner: < x: 1; y: 2, > }  # trailing comment\n\
            colon: { z: 3 }\n\
            dims: [ -1, 3, 224 ]\n\
            dims: 7\n\
            empty: []\n\
            input [ { name: \"a\" }, { name: \"b\" } ];\n\
            rep { n: 1 } rep { n: 2 },\n";
        let m = ok(text);
        let outer = sub(&m, "outer");
        let inner = sub(outer, "inner");
        assert_eq!(values(inner, "x"), [&Value::Int(1)]);
        assert_eq!(values(inner, "y"), [&Value::Int(2)]);
        assert_eq!(values(sub(&m, "colon"), "z"), [&Value::Int(3)]);
        assert_eq!(values(&m, "dims"), [&Value::Int(-1), &Value::Int(3), &Value::Int(224), &Value::Int(7)]);
        assert!(values(&m, "empty").is_empty());
        let inputs = values(&m, "input");
        assert_eq!(inputs.len(), 2);
        let Value::Message(b) = inputs[1] else { panic!() };
        assert_eq!(values(b, "name"), [&Value::Str("b".into())]);
        assert_eq!(values(&m, "rep").len(), 2);
        let field = m.fields.iter().find(|f| f.name == "colon").unwrap();
        assert_eq!(field.pos, Pos { line: 3, column: 1 });
        assert_eq!(field.value_pos, Pos { line: 3, column: 8 });
    }

    #[test]
    fn empty_and_comment_only_files_are_empty_messages() {
        assert_eq!(ok(""), Message::default());
        assert_eq!(ok("# nothing\n  \n# here"), Message::default());
    }

    #[test]
    fn malformed_inputs_name_line_column_and_what_was_expected() {
        let (l, c, m) = err("name: \"a\"\nmax_batch_size 8\n");
        assert_eq!((l, c), (2, 16));
        assert!(m.contains("expected `:` after the field name `max_batch_size`"), "{m}");

        let (l, c, m) = err("input {\n  name: \"x\"\n");
        assert_eq!((l, c), (3, 1));
        assert!(m.contains("expected `}` to close the message"), "{m}");

        let (l, c, m) = err("input { name: \"x\" >");
        assert_eq!((l, c), (1, 19));
        assert!(m.contains("expected a field name or `}`, found `>`"), "{m}");

        let (l, c, m) = err("a: 1\n}\n");
        assert_eq!((l, c), (2, 1));
        assert!(m.contains("expected a field name, found `}`"), "{m}");

        let (l, c, m) = err("name: \"abc\n");
        assert_eq!((l, c), (1, 7));
        assert!(m.contains("string not closed"), "{m}");

        let (l, c, m) = err("dims: [1, 2 3]");
        assert_eq!((l, c), (1, 13));
        assert!(m.contains("expected `,` or `]` in the list `dims`"), "{m}");

        let (l, c, m) = err("  s: \"a\\qb\"");
        assert_eq!((l, c), (1, 8));
        assert!(m.contains("unknown escape `\\q`"), "{m}");

        let (l, c, m) = err("x: 12ab");
        assert_eq!((l, c), (1, 4));
        assert!(m.contains("malformed number `12ab`"), "{m}");

        let (l, c, m) = err("x: 017");
        assert_eq!((l, c), (1, 4));
        assert!(m.contains("octal"), "{m}");

        let (l, c, m) = err("x: - foo");
        assert_eq!((l, c), (1, 6));
        assert!(m.contains("expected a number after `-`"), "{m}");

        let (l, c, m) = err("x:\n\n   @");
        assert_eq!((l, c), (3, 4));
        assert!(m.contains("unexpected character '@'"), "{m}");

        let (l, c, m) = err("x: ");
        assert_eq!((l, c), (1, 4));
        assert!(m.contains("expected a value for `x`, found the end of the file"), "{m}");

        let (l, c, m) = err("x: \"\\xff\"");
        assert_eq!((l, c), (1, 4));
        assert!(m.contains("not valid UTF-8"), "{m}");

        let (l, c, m) = err("x: 99999999999999999999999999999999999999999");
        assert_eq!((l, c), (1, 4));
        assert!(m.contains("too large"), "{m}");
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let deep = "a { ".repeat(10_000);
        let (l, _, m) = err(&deep);
        assert_eq!(l, 1);
        assert!(m.contains("nested deeper than 64"), "{m}");
        let lists = "a: [ { ".repeat(10_000);
        let (_, _, m) = err(&lists);
        assert!(m.contains("nested deeper than 64"), "{m}");
        let (l, c, m) = err("a: [[1]]");
        assert_eq!((l, c), (1, 5));
        assert!(m.contains("expected a value for `a`, found `[`"), "{m}");
        let fine = format!("{}{}", "a { ".repeat(MAX_DEPTH), "} ".repeat(MAX_DEPTH));
        ok(&fine);
    }
}
