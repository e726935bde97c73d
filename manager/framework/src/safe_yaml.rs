//! Bounded, content-free parsing of user-supplied YAML (cloud-configs, kubeconfigs).
//!
//! Two guarantees, both by construction rather than by filtering messages afterwards:
//!
//! - **Bounded.** A document is checked against [`Limits`] (size, then a linear pre-scan of its
//!   nesting depth) before the YAML parser sees it, so a deep or huge document is refused in
//!   time proportional to its size. A document that uses aliases is first walked once with a
//!   budget ([`Limits::max_expansion`]), so an alias bomb (exponential or quadratic) is refused
//!   after a bounded amount of work; the parser's own repetition limit stays as a backstop.
//! - **Never quoted.** A [`DocumentError`] holds a [`FieldPath`] built only from the schema's
//!   own field names and list indices, and a [`Problem`] whose text comes only from this
//!   module's tables and the schema. The parser's message is read to pick the kind of problem,
//!   never copied, so no value, unknown key or line of the document can reach a log, a status
//!   or an event through it.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{DeserializeOwned, Deserializer, Visitor};

/// Size and nesting limits checked before a document reaches the YAML parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest document accepted, in bytes.
    pub max_bytes: usize,
    /// The deepest nesting accepted, as counted by the pre-scan (see [`check`]).
    pub max_depth: usize,
    /// How large a document using aliases may become once they are expanded, in units of one
    /// per node plus one per byte of scalar text: at most this many times the document's own
    /// size, plus [`EXPANSION_ALLOWANCE`].
    pub max_expansion: usize,
}

/// What any document may expand to through aliases on top of [`Limits::max_expansion`]
/// times its size, so that small documents may reuse anchors freely.
pub const EXPANSION_ALLOWANCE: usize = 64 * 1024;

/// Limits for cloud-configs: 1 MiB (a Kubernetes Secret's own limit), 64 levels, 10 times
/// its size once aliases are expanded.
pub const CLOUD_CONFIG_LIMITS: Limits = Limits { max_bytes: 1 << 20, max_depth: 64, max_expansion: 10 };

/// Limits for kubeconfig files: 4 MiB (many embedded certificates), 64 levels, 10 times.
pub const KUBECONFIG_LIMITS: Limits = Limits { max_bytes: 4 << 20, max_depth: 64, max_expansion: 10 };

/// The parser's own nesting limit while deserializing (serde_yaml's).
const PARSER_RECURSION_LIMIT: usize = 128;

/// A place in a document, written only from schema field names and indices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// The whole document.
    pub fn root() -> Self {
        Self::default()
    }

    /// A field of this node.
    pub fn field(&self, name: &'static str) -> Self {
        if self.0.is_empty() { Self(name.to_string()) } else { Self(format!("{}.{name}", self.0)) }
    }

    /// An item of this list.
    pub fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }

    /// An entry of a map whose keys are user data (the key itself is never written).
    pub fn entry(&self) -> Self {
        self.field("<key>")
    }

    /// Whether this is the whole document.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { f.write_str("document") } else { f.write_str(&self.0) }
    }
}

/// What is wrong. Every text is this module's or the schema's, never the document's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The document is larger than [`Limits::max_bytes`].
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The pre-scan counted more nesting levels than [`Limits::max_depth`].
    TooDeep {
        /// The limit in levels.
        limit: usize,
    },
    /// The document is not UTF-8 text.
    NotUtf8,
    /// YAML aliases expand beyond [`Limits::max_expansion`] (or the parser's own
    /// repetition limit).
    AliasLimit {
        /// The limit, as a multiple of the document's size.
        factor: usize,
    },
    /// Nesting beyond the parser's own recursion limit.
    RecursionLimit,
    /// A syntax error; the hint, when known, is the YAML parser's fixed description.
    Syntax {
        /// A fixed description of the error, from this module's table.
        hint: Option<&'static str>,
    },
    /// More than one YAML document.
    MultipleDocuments,
    /// An alias refers to no anchor.
    UnknownAnchor,
    /// A `<<` merge key is misused.
    BadMerge,
    /// A key that is not a field here.
    UnknownField {
        /// The fields allowed at this place.
        allowed: Vec<&'static str>,
    },
    /// A required field is absent.
    MissingField {
        /// The field, when the schema knows it.
        field: Option<&'static str>,
    },
    /// A field is given twice.
    DuplicateField {
        /// The field, when the schema knows it.
        field: Option<&'static str>,
    },
    /// A value of the wrong type.
    WrongType {
        /// What was expected.
        expected: &'static str,
        /// What was found.
        found: &'static str,
    },
    /// A value of the right type that is not acceptable (for example out of range).
    WrongValue {
        /// What was expected.
        expected: &'static str,
    },
    /// A value that is not one of a fixed set.
    UnknownVariant {
        /// The accepted values.
        allowed: Vec<&'static str>,
    },
    /// A check failed; the text says which.
    Invalid(&'static str),
    /// This place clashes with another (duplicates, overlaps).
    Clash {
        /// How they clash, for example "duplicates" or "overlaps".
        how: &'static str,
        /// The other place.
        other: FieldPath,
    },
    /// The parser failed in a way this module does not recognise; its message is withheld.
    Unrecognized,
}

fn join(names: &[&'static str]) -> String {
    names.join(", ")
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::TooLarge { limit } => write!(f, "the document is larger than the limit of {limit} bytes"),
            Problem::TooDeep { limit } => write!(
                f,
                "the document nests deeper than the limit of {limit} levels (counted before parsing, conservatively)"
            ),
            Problem::NotUtf8 => f.write_str("the document is not UTF-8 text"),
            Problem::AliasLimit { factor } => write!(
                f,
                "YAML aliases expand beyond the limit of {factor} times the document's own size (plus {EXPANSION_ALLOWANCE})"
            ),
            Problem::RecursionLimit => {
                write!(f, "nests deeper than the parser's limit of {PARSER_RECURSION_LIMIT} levels")
            }
            Problem::Syntax { hint: Some(hint) } => write!(f, "is not valid YAML: {hint}"),
            Problem::Syntax { hint: None } => f.write_str("is not valid YAML"),
            Problem::MultipleDocuments => f.write_str("holds more than one YAML document; give exactly one"),
            Problem::UnknownAnchor => f.write_str("uses an alias whose anchor is not defined before it"),
            Problem::BadMerge => f.write_str("misuses a << merge key (it takes a mapping or a list of mappings)"),
            Problem::UnknownField { allowed } if allowed.is_empty() => f.write_str("has an unknown field"),
            Problem::UnknownField { allowed } => write!(f, "has an unknown field (allowed: {})", join(allowed)),
            Problem::MissingField { field: Some(name) } => write!(f, "misses the required field {name}"),
            Problem::MissingField { field: None } => f.write_str("misses a required field"),
            Problem::DuplicateField { field: Some(name) } => write!(f, "gives the field {name} twice"),
            Problem::DuplicateField { field: None } => f.write_str("gives a field twice"),
            Problem::WrongType { expected, found } => write!(f, "expected {expected}, found {found}"),
            Problem::WrongValue { expected } => write!(f, "is not acceptable: expected {expected}"),
            Problem::UnknownVariant { allowed } if allowed.is_empty() => f.write_str("is not an accepted value"),
            Problem::UnknownVariant { allowed } => write!(f, "is not one of {}", join(allowed)),
            Problem::Invalid(text) => f.write_str(text),
            Problem::Clash { how, other } => write!(f, "{how} {other}"),
            Problem::Unrecognized => {
                f.write_str("could not be read (the parser's message is withheld: it may quote the document)")
            }
        }
    }
}

/// Why a document was rejected: where, what, and the line and column when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// Where.
    pub path: FieldPath,
    /// What.
    pub problem: Problem,
    /// 1-based line and column, when the parser reported them.
    pub location: Option<(usize, usize)>,
}

impl DocumentError {
    /// A problem at `path`, without a location.
    pub fn at(path: FieldPath, problem: Problem) -> Self {
        Self { path, problem, location: None }
    }

    /// A failed check at `path`.
    pub fn invalid(path: FieldPath, text: &'static str) -> Self {
        Self::at(path, Problem::Invalid(text))
    }

    fn whole(problem: Problem) -> Self {
        Self::at(FieldPath::root(), problem)
    }
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)?;
        if let Some((line, column)) = self.location {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}

impl std::error::Error for DocumentError {}

/// The names a schema may print: its field names, its enum values, and the fixed messages its
/// own `deserialize_with` functions raise (see [`custom`]).
#[derive(Debug, Clone, Default)]
pub struct Schema {
    fields: BTreeSet<&'static str>,
    variants: BTreeSet<&'static str>,
    messages: Vec<&'static str>,
}

impl Schema {
    /// An empty schema: paths show indices only, errors their kind only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Learn the field names of struct `T`, or the values of enum `T`, from its `Deserialize`.
    pub fn with<T: DeserializeOwned>(mut self) -> Self {
        let _ = T::deserialize(Introspect(&mut self));
        self
    }

    /// Learn fixed messages raised with [`custom`].
    pub fn with_messages(mut self, messages: &[&'static str]) -> Self {
        self.messages.extend_from_slice(messages);
        self
    }

    fn field(&self, name: &str) -> Option<&'static str> {
        self.fields.get(name).copied()
    }

    fn variant(&self, name: &str) -> Option<&'static str> {
        self.variants.get(name).copied()
    }
}

/// A deserializer that only records the names a struct or enum declares, then stops.
struct Introspect<'a>(&'a mut Schema);

impl<'de> Deserializer<'de> for Introspect<'_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("introspection only"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.fields.extend(fields.iter().copied());
        Err(serde::de::Error::custom("introspection only"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.variants.extend(variants.iter().copied());
        Err(serde::de::Error::custom("introspection only"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// An error for a schema's `deserialize_with` function. `message` must also be registered with
/// [`Schema::with_messages`]; it is then shown as written, and any other custom message is
/// withheld.
pub fn custom<E: serde::de::Error>(message: &'static str) -> E {
    E::custom(message)
}

/// Check `bytes` against `limits` and return them as text: size, UTF-8, nesting depth, and,
/// when the document may use aliases, their expanded size.
///
/// The depth pre-scan is linear and conservative: it counts a level for every indentation step,
/// every leading `- `, `? ` or `: ` indicator and every open flow bracket (`[`, `{`) outside
/// quotes, comments and block scalars. It may count more levels than the parser would (a plain
/// scalar continued on a more indented line counts one), never fewer, so a document within the
/// limit always passes and one beyond it never reaches the parser.
pub fn check<'a>(bytes: &'a [u8], limits: &Limits) -> Result<&'a str, DocumentError> {
    if bytes.len() > limits.max_bytes {
        return Err(DocumentError::whole(Problem::TooLarge { limit: limits.max_bytes }));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| DocumentError::whole(Problem::NotUtf8))?;
    if let Some(line) = deeper_than(text, limits.max_depth) {
        return Err(DocumentError {
            path: FieldPath::root(),
            problem: Problem::TooDeep { limit: limits.max_depth },
            location: Some((line, 1)),
        });
    }
    // `*` starts every alias; without one there is nothing to expand.
    if text.contains('*') {
        check_expansion(text, limits)?;
    }
    Ok(text)
}

/// The first line (1-based) where the counted depth exceeds `max`, if any.
fn deeper_than(text: &str, max: usize) -> Option<usize> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut quote: Option<char> = None;
    // The indentation of the line that opened a block scalar (`|` or `>`).
    let mut block_scalar: Option<usize> = None;
    // libyaml also breaks lines at NEL, LS and PS.
    for (number, line) in text.split(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}']).enumerate() {
        let indent = line.bytes().take_while(|&b| b == b' ').count();
        let content = &line[indent..];
        let mut chars = content.chars().peekable();
        let mut depth;
        let mut value_start = true;
        if quote.is_none() && flow == 0 {
            let blank = content.trim_start_matches([' ', '\t']).is_empty();
            if let Some(parent) = block_scalar {
                if blank || indent > parent {
                    continue;
                }
                block_scalar = None;
            }
            if blank || content.starts_with('#') {
                continue;
            }
            if content.starts_with("---") || content.starts_with("...") {
                indents.clear();
                chars.nth(2);
            } else {
                while indents.last().is_some_and(|&top| top > indent) {
                    indents.pop();
                }
                if indents.last().is_none_or(|&top| top < indent) {
                    indents.push(indent);
                }
            }
            depth = indents.len();
        } else {
            depth = indents.len();
        }
        if depth + flow > max {
            return Some(number + 1);
        }
        let mut previous = ' ';
        while let Some(c) = chars.next() {
            if let Some(q) = quote {
                if q == '"' && c == '\\' {
                    chars.next();
                } else if c == q {
                    quote = None;
                }
                previous = c;
                continue;
            }
            let followed_by_space = chars.peek().is_none_or(|n| *n == ' ' || *n == '\t');
            match c {
                '#' if previous == ' ' || previous == '\t' => break,
                ' ' | '\t' => {}
                '"' | '\'' if value_start => quote = Some(c),
                '[' | '{' if value_start || flow > 0 => {
                    flow += 1;
                    value_start = true;
                    if depth + flow > max {
                        return Some(number + 1);
                    }
                }
                ']' | '}' if flow > 0 => {
                    flow -= 1;
                    value_start = false;
                }
                ',' if flow > 0 => value_start = true,
                '-' | '?' | ':' if followed_by_space && (value_start || c == ':') => {
                    if flow == 0 && c != ':' {
                        depth += 1;
                        if depth + flow > max {
                            return Some(number + 1);
                        }
                    }
                    value_start = true;
                }
                ':' if flow > 0 => value_start = true,
                '|' | '>' if value_start && flow == 0 => {
                    block_scalar = Some(indent);
                    break;
                }
                // An anchor or tag comes before the node it names.
                '&' | '!' if value_start => while chars.next_if(|n| *n != ' ' && *n != '\t').is_some() {},
                _ => value_start = false,
            }
            previous = c;
        }
    }
    None
}

/// The custom error of the expansion walk (never shown: it becomes [`Problem::AliasLimit`]).
const EXPANSION_EXCEEDED: &str = "alias expansion budget exceeded";

/// Walk every document of `text` once, aliases expanded, and stop as soon as the expanded size
/// passes the budget. Other errors are left to the typed parse, which describes them better.
fn check_expansion(text: &str, limits: &Limits) -> Result<(), DocumentError> {
    let budget = limits.max_expansion.saturating_mul(text.len()).saturating_add(EXPANSION_ALLOWANCE);
    let left = std::cell::Cell::new(budget);
    for document in serde_yaml::Deserializer::from_str(text) {
        if let Err(e) = serde::de::DeserializeSeed::deserialize(Walk(&left), document) {
            let message = e.to_string();
            if message.contains(EXPANSION_EXCEEDED) || message.contains("repetition limit exceeded") {
                let location = e.location().map(|l| (l.line(), l.column()));
                let problem = Problem::AliasLimit { factor: limits.max_expansion };
                return Err(DocumentError { path: FieldPath::root(), problem, location });
            }
            return Ok(());
        }
    }
    Ok(())
}

/// Visits every node of a document, paying one unit per node and one per byte of scalar text.
#[derive(Clone, Copy)]
struct Walk<'a>(&'a std::cell::Cell<usize>);

impl Walk<'_> {
    fn pay<E: serde::de::Error>(self, units: usize) -> Result<(), E> {
        match self.0.get().checked_sub(units.saturating_add(1)) {
            Some(left) => {
                self.0.set(left);
                Ok(())
            }
            None => Err(E::custom(EXPANSION_EXCEEDED)),
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.pay(0)
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.pay(0)
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.pay(0)
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.pay(0)
    }
    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<(), E> {
        self.pay(text.len())
    }
    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<(), E> {
        self.pay(bytes.len())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.pay(0)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.pay(0)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.pay(0)?;
        deserializer.deserialize_any(self)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.pay(0)?;
        deserializer.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.pay(0)?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.pay(0)?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged node (`!tag value`): the tag, then its value.
        use serde::de::VariantAccess;
        self.pay(0)?;
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

/// Parse one YAML document of type `T` within `limits`; errors speak in `schema`'s words only.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8], limits: &Limits, schema: &Schema) -> Result<T, DocumentError> {
    let text = check(bytes, limits)?;
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| describe(&e, schema, limits))
}

/// Parse every YAML document of `bytes` as a `T` (kubeconfig files may hold several).
pub fn documents_from_slice<T: DeserializeOwned>(
    bytes: &[u8],
    limits: &Limits,
    schema: &Schema,
) -> Result<Vec<T>, DocumentError> {
    let text = check(bytes, limits)?;
    serde_yaml::Deserializer::from_str(text)
        .map(|document| serde_path_to_error::deserialize(document).map_err(|e| describe(&e, schema, limits)))
        .collect()
}

fn describe(error: &serde_path_to_error::Error<serde_yaml::Error>, schema: &Schema, limits: &Limits) -> DocumentError {
    let inner = error.inner();
    let problem = classify(&inner.to_string(), schema, limits);
    let mut segments: Vec<&serde_path_to_error::Segment> = error.path().iter().collect();
    // An unknown field's path ends with the unknown key itself: show the place that holds it.
    if matches!(problem, Problem::UnknownField { .. })
        && matches!(segments.last(), Some(serde_path_to_error::Segment::Map { .. }))
    {
        segments.pop();
    }
    let mut path = FieldPath::root();
    for segment in segments {
        path = match segment {
            serde_path_to_error::Segment::Seq { index } => path.index(*index),
            serde_path_to_error::Segment::Map { key } => match schema.field(key) {
                Some(name) => path.field(name),
                None => path.entry(),
            },
            serde_path_to_error::Segment::Enum { .. } => path,
            serde_path_to_error::Segment::Unknown => path.field("?"),
        };
    }
    let location = inner.location().map(|l| (l.line(), l.column()));
    DocumentError { path, problem, location }
}

/// Syntax errors libyaml reports, as fixed text (the parser's problem descriptions).
const SYNTAX_HINTS: &[&str] = &[
    "did not find expected key",
    "did not find expected node content",
    "did not find expected '-' indicator",
    "did not find expected ',' or ']'",
    "did not find expected ',' or '}'",
    "could not find expected ':'",
    "mapping values are not allowed in this context",
    "block sequence entries are not allowed in this context",
    "found character that cannot start any token",
    "found a tab character that violates indentation",
    "found undefined tag handle",
    "found unknown escape character",
    "found unexpected end of stream",
    "found unexpected document indicator",
    "did not find expected comment or line break",
    "did not find expected alphabetic or numeric character",
    "found duplicate anchor",
    "control characters are not allowed",
    "invalid leading UTF-8 octet",
    "invalid trailing UTF-8 octet",
    "EOF while parsing a value",
];

/// Pick the kind of problem from the parser's message. The message may quote the document, so
/// nothing of it is copied: every output is a constant of this module or a name of `schema`.
fn classify(message: &str, schema: &Schema, limits: &Limits) -> Problem {
    if let Some(known) = schema.messages.iter().find(|m| message.contains(**m)) {
        return Problem::Invalid(known);
    }
    if message.contains("repetition limit exceeded") {
        return Problem::AliasLimit { factor: limits.max_expansion };
    }
    if message.contains("recursion limit exceeded") {
        return Problem::RecursionLimit;
    }
    if message.contains("more than one document") {
        return Problem::MultipleDocuments;
    }
    if message.contains("unknown anchor") {
        return Problem::UnknownAnchor;
    }
    if message.contains("merging") || message.contains("in merge") {
        return Problem::BadMerge;
    }
    if message.contains("unknown field `") {
        let allowed = backticked(after_last(message, "expected")).filter_map(|n| schema.field(n)).collect();
        return Problem::UnknownField { allowed };
    }
    if message.contains("unknown variant `") {
        let allowed = backticked(after_last(message, "expected")).filter_map(|n| schema.variant(n)).collect();
        return Problem::UnknownVariant { allowed };
    }
    if let Some(rest) = after_first(message, "missing field `") {
        return Problem::MissingField { field: backticked_head(rest).and_then(|n| schema.field(n)) };
    }
    if let Some(rest) = after_first(message, "duplicate field `") {
        return Problem::DuplicateField { field: backticked_head(rest).and_then(|n| schema.field(n)) };
    }
    if let Some(rest) = after_first(message, "invalid type: ") {
        return Problem::WrongType { expected: expected_kind(message), found: found_kind(rest) };
    }
    if message.contains("invalid value: ") || message.contains("invalid length ") {
        return Problem::WrongValue { expected: expected_kind(message) };
    }
    if let Some(hint) = SYNTAX_HINTS.iter().find(|h| message.contains(**h)) {
        return Problem::Syntax { hint: Some(hint) };
    }
    if message.contains("while parsing") || message.contains("while scanning") {
        return Problem::Syntax { hint: None };
    }
    Problem::Unrecognized
}

fn after_first<'m>(message: &'m str, marker: &str) -> Option<&'m str> {
    message.find(marker).map(|i| &message[i + marker.len()..])
}

fn after_last<'m>(message: &'m str, marker: &str) -> &'m str {
    message.rfind(marker).map_or("", |i| &message[i + marker.len()..])
}

/// The names between backticks (only ever looked up in the schema, never printed).
fn backticked(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

fn backticked_head(rest: &str) -> Option<&str> {
    rest.split('`').next()
}

/// What serde says it expected, as one of a few fixed phrases.
fn expected_kind(message: &str) -> &'static str {
    let expected = after_last(message, ", expected ");
    let table: &[(&str, &'static str)] = &[
        ("a duration", "a duration such as 1m30s, 500ms or 2h"),
        ("u8", "a whole number from 0 to 255"),
        ("u16", "a whole number from 0 to 65535"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number of at least 0"),
        ("usize", "a whole number of at least 0"),
        ("i8", "a whole number"),
        ("i16", "a whole number"),
        ("i32", "a whole number"),
        ("i64", "a whole number"),
        ("f32", "a number"),
        ("f64", "a number"),
        ("a boolean", "true or false"),
        ("a string", "a string"),
        ("a borrowed string", "a string"),
        ("a character", "a single character"),
        ("a sequence", "a list"),
        ("a map", "a mapping"),
        ("struct ", "a mapping"),
        ("enum ", "one of the accepted values"),
        ("variant identifier", "one of the accepted values"),
        ("field identifier", "a field name"),
        ("option", "a value or nothing"),
        ("IP address", "an IP address"),
        ("network", "a CIDR such as 10.0.0.0/24"),
        ("duration", "a duration such as 1m30s, 500ms or 2h"),
    ];
    table.iter().find(|(marker, _)| expected.starts_with(marker)).map_or("a value of another type", |(_, kind)| kind)
}

/// What serde says it found, as one of a few fixed phrases.
fn found_kind(rest: &str) -> &'static str {
    let table: &[(&str, &'static str)] = &[
        ("string", "a string"),
        ("integer", "a number"),
        ("floating point", "a number"),
        ("boolean", "a boolean"),
        ("sequence", "a list"),
        ("map", "a mapping"),
        ("unit value", "nothing (null)"),
        ("unit", "nothing (null)"),
        ("Option value", "nothing (null)"),
        ("char", "a character"),
        ("enum", "a tagged value"),
    ];
    table.iter().find(|(marker, _)| rest.starts_with(marker)).map_or("a value of another type", |(_, kind)| kind)
}

/// A map of string keys to string values that rejects a key given twice (serde keeps the last).
pub fn unique_string_map<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    struct MapVisitor;
    impl<'de> Visitor<'de> for MapVisitor {
        type Value = std::collections::BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut map = std::collections::BTreeMap::new();
            while let Some((key, value)) = access.next_entry::<String, String>()? {
                if map.insert(key, value).is_some() {
                    return Err(custom(DUPLICATE_KEY));
                }
            }
            Ok(map)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(std::collections::BTreeMap::new())
        }
    }
    deserializer.deserialize_map(MapVisitor)
}

/// The message of [`unique_string_map`]; register it with [`Schema::with_messages`].
pub const DUPLICATE_KEY: &str = "gives a key twice";

/// Hostile documents shared by the tests of every format: each with the problem it must be
/// refused with under [`CLOUD_CONFIG_LIMITS`]. Public so that each provider crate (and a
/// vendor's) tests its own parser against the same set.
pub mod hostile {
    use super::{CLOUD_CONFIG_LIMITS, Problem};

    /// 100,000 levels of flow sequences under a key.
    pub fn deep_flow() -> Vec<u8> {
        format!("instances: {}{}\n", "[".repeat(100_000), "]".repeat(100_000)).into_bytes()
    }

    /// 100,000 levels of flow mappings.
    pub fn deep_mappings() -> Vec<u8> {
        format!("{}x: 1{}\n", "{a: ".repeat(100_000), "}".repeat(100_000)).into_bytes()
    }

    /// 100,000 levels of block sequences on one line.
    pub fn deep_block() -> Vec<u8> {
        format!("{}x\n", "- ".repeat(100_000)).into_bytes()
    }

    /// A valid-looking document of 10 MiB (one long comment after a key).
    pub fn ten_mib() -> Vec<u8> {
        let mut doc = b"instances: []\n".to_vec();
        doc.extend(
            std::iter::repeat_n(b"# padding padding padding padding padding padding padding pad\n", 10 << 14).flatten(),
        );
        doc
    }

    /// The billion laughs: nine levels of nine aliases of the level below.
    pub fn billion_laughs() -> Vec<u8> {
        let mut doc = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for level in 1..10 {
            let below = format!("*a{}", level - 1);
            doc.push_str(&format!("a{level}: &a{level} [{}]\n", vec![below; 9].join(", ")));
        }
        doc.push_str("instances: *a9\n");
        doc.into_bytes()
    }

    /// A quadratic bomb: one anchor of 10,000 items aliased 10,000 times (100 KB of text,
    /// 100 million nodes once expanded; within the parser's own repetition limit).
    pub fn quadratic() -> Vec<u8> {
        let items = vec!["x"; 10_000].join(", ");
        let aliases = vec!["*a"; 10_000].join(", ");
        format!("a: &a [{items}]\ninstances: [{aliases}]\n").into_bytes()
    }

    /// Every hostile document, named, with the problem it must be refused with.
    pub fn all() -> Vec<(&'static str, Vec<u8>, Problem)> {
        let deep = Problem::TooDeep { limit: CLOUD_CONFIG_LIMITS.max_depth };
        let alias = Problem::AliasLimit { factor: CLOUD_CONFIG_LIMITS.max_expansion };
        vec![
            ("100,000 nested flow sequences", deep_flow(), deep.clone()),
            ("100,000 nested flow mappings", deep_mappings(), deep.clone()),
            ("100,000 nested block sequences", deep_block(), deep),
            ("a 10 MiB document", ten_mib(), Problem::TooLarge { limit: CLOUD_CONFIG_LIMITS.max_bytes }),
            ("the billion laughs", billion_laughs(), alias.clone()),
            ("a quadratic alias bomb", quadratic(), alias),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        #[serde(default)]
        port: u16,
        #[serde(default)]
        items: Vec<Item>,
        #[serde(default, deserialize_with = "unique_string_map")]
        labels: std::collections::BTreeMap<String, String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        kind: Kind,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    enum Kind {
        Small,
        Large,
    }

    fn schema() -> Schema {
        Schema::new().with::<Doc>().with::<Item>().with::<Kind>().with_messages(&[DUPLICATE_KEY])
    }

    fn err(doc: &str) -> DocumentError {
        from_slice::<Doc>(doc.as_bytes(), &CLOUD_CONFIG_LIMITS, &schema()).expect_err("must be rejected")
    }

    #[test]
    fn introspection_learns_fields_and_variants() {
        let s = schema();
        assert_eq!(s.field("items"), Some("items"));
        assert_eq!(s.variant("Large"), Some("Large"));
        assert_eq!(s.field("nope"), None);
    }

    #[test]
    fn an_unknown_field_lists_the_allowed_ones_and_never_its_own_name() {
        let e = err("name: a\nitems:\n  - kind: Small\n    SECRET-KEY: 1\n");
        assert_eq!(e.path.to_string(), "items[0]");
        assert_eq!(e.problem, Problem::UnknownField { allowed: vec!["kind"] });
        assert_eq!(e.location.map(|l| l.0), Some(4));
        assert!(!e.to_string().contains("SECRET"), "{e}");
    }

    #[test]
    fn wrong_types_name_both_kinds() {
        let e = err("name: [SECRET]\n");
        assert_eq!(e.path.to_string(), "name");
        assert_eq!(e.problem, Problem::WrongType { expected: "a string", found: "a list" });
        let e = err("name: a\nport: SECRET\n");
        assert_eq!(e.problem, Problem::WrongType { expected: "a whole number from 0 to 65535", found: "a string" });
        let e = err("name: a\nport: 70000\n");
        assert_eq!(e.problem, Problem::WrongValue { expected: "a whole number from 0 to 65535" });
    }

    #[test]
    fn unknown_values_list_the_accepted_ones() {
        let e = err("name: a\nitems: [{kind: SECRET}]\n");
        assert_eq!(e.path.to_string(), "items[0].kind");
        assert_eq!(e.problem, Problem::UnknownVariant { allowed: vec!["Small", "Large"] });
    }

    #[test]
    fn map_keys_from_the_document_are_not_written_in_paths() {
        let e = err("name: a\nlabels: {SECRET: [1]}\n");
        assert_eq!(e.path.to_string(), "labels.<key>");
        let e = err("name: a\nlabels: {SECRET: a, SECRET: b}\n");
        assert_eq!(e.problem, Problem::Invalid(DUPLICATE_KEY));
    }

    #[test]
    fn missing_and_duplicate_fields_are_named_from_the_schema() {
        assert_eq!(err("port: 1\n").problem, Problem::MissingField { field: Some("name") });
        assert_eq!(err("name: a\nname: b\n").problem, Problem::DuplicateField { field: Some("name") });
    }

    #[test]
    fn syntax_errors_keep_the_position_and_a_fixed_hint() {
        let e = err("name: \"SECRET\nport: [1, 2\n");
        assert!(matches!(e.problem, Problem::Syntax { .. }), "{e:?}");
        assert!(e.location.is_some());
        let e = err("name: a\n---\nname: b\n");
        assert_eq!(e.problem, Problem::MultipleDocuments);
    }

    #[test]
    fn a_document_over_the_size_limit_is_refused_before_parsing() {
        let limits = Limits { max_bytes: 10, ..CLOUD_CONFIG_LIMITS };
        let e = from_slice::<Doc>(b"name: abcdefghijkl\n", &limits, &schema()).unwrap_err();
        assert_eq!(e.problem, Problem::TooLarge { limit: 10 });
        assert!(e.to_string().contains("10 bytes"), "{e}");
    }

    #[test]
    fn the_depth_scan_counts_every_kind_of_nesting() {
        let depth = |text: &str| (0..100).find(|&max| deeper_than(text, max).is_none()).unwrap();
        assert_eq!(depth("a: 1\n"), 1);
        assert_eq!(depth("a:\n  b:\n    c: 1\n  d: 2\n"), 3);
        assert_eq!(depth("a: [[1], {b: [2]}]\n"), 4);
        assert_eq!(depth("- - - a\n"), 4);
        assert_eq!(depth("a:\n- b\n"), 2);
        assert_eq!(depth("a: &x [[1]]\n"), 3);
        // Brackets in quotes, comments, plain scalars and block scalars are not nesting.
        assert_eq!(depth("a: \"[[[[\"\nb: '{{{{'\nc: x[[[ # [[[[\nd: |\n  [[[[\n    {{{{\ne: 1\n"), 1);
        // A stray quote in a plain scalar does not hide the nesting after it.
        assert_eq!(depth("a: it's\nb: [[[1]]]\n"), 4);
        // Carriage returns and Unicode line separators are line breaks too.
        assert_eq!(depth("a:\r  b:\r    c: 1\r"), 3);
        assert_eq!(depth("a:\u{2028}  b:\u{2028}    c: 1"), 3);
    }

    #[test]
    fn the_depth_scan_is_never_below_what_the_parser_sees() {
        // The parser's own recursion limit (128) trips on these; the scan must count at least
        // as deep, so a limit below 128 always refuses them first.
        for doc in [
            "a: ".to_string() + &"[".repeat(200),
            "a: ".to_string() + &"{b: ".repeat(200),
            (0..200).map(|i| format!("{}k{i}:\n", " ".repeat(i))).collect::<String>(),
            "- ".repeat(200) + "x\n",
        ] {
            assert!(deeper_than(&doc, 127).is_some(), "{doc:.60}");
            let e = from_slice::<Doc>(doc.as_bytes(), &CLOUD_CONFIG_LIMITS, &schema()).unwrap_err();
            assert_eq!(e.problem, Problem::TooDeep { limit: 64 }, "{doc:.60}");
        }
    }

    #[test]
    fn hostile_documents_are_refused_with_the_limit_they_break() {
        for (name, doc, want) in hostile::all() {
            let e = from_slice::<Doc>(&doc, &CLOUD_CONFIG_LIMITS, &schema()).unwrap_err();
            assert_eq!(e.problem, want, "{name}: {e}");
            assert!(e.to_string().contains("limit of"), "{name}: {e}");
        }
    }

    #[test]
    fn the_expansion_limit_is_named_in_the_message() {
        let e = from_slice::<Doc>(&hostile::billion_laughs(), &CLOUD_CONFIG_LIMITS, &schema()).unwrap_err();
        let message = e.to_string();
        assert!(
            message.starts_with(
                "document: YAML aliases expand beyond the limit of 10 times the document's own size (plus 65536)"
            ),
            "{message}"
        );
    }

    #[test]
    fn ordinary_anchors_still_work() {
        let doc = "defaults: &d {kind: Small}\nname: a\nitems: [*d, *d, *d]\n";
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct WithDefaults {
            defaults: Item,
            name: String,
            items: Vec<Item>,
        }
        let parsed: WithDefaults = from_slice(doc.as_bytes(), &CLOUD_CONFIG_LIMITS, &Schema::new()).unwrap();
        assert_eq!(parsed.items.len(), 3);
        // Many uses of a small anchor fit in the allowance.
        let many = format!(
            "name: &n a\nitems: []\nlabels: {{{}}}\n",
            (0..2000).map(|i| format!("k{i}: *n")).collect::<Vec<_>>().join(", ")
        );
        from_slice::<Doc>(many.as_bytes(), &CLOUD_CONFIG_LIMITS, &schema()).unwrap();
    }
}
