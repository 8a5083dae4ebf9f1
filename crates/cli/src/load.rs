//! Reading `tally load`'s input: files (or stdin) of events as CSV or NDJSON, plain, `.gz` or
//! `.zst`, one event at a time with its line number, each checked by the rules the API uses.
//! The compression is told by the name, else (stdin, or a name without `.gz` or `.zst`) by
//! the first bytes: gzip's `1f 8b`, zstd's `28 b5 2f fd` (no CSV or NDJSON text starts so:
//! a control byte; not UTF-8). A UTF-8 byte order mark before the first line is skipped.
//!
//! - **CSV**: a header `ns,key,ts,n,<dimension>…`, then one event per record. `ts` is unix
//!   seconds or RFC 3339 (empty: now), `n` an integer (empty: 1); a dimension column's empty
//!   cell means the event does not carry it. Fields are RFC 4180 (quotes for commas).
//! - **NDJSON**: one event per line, in the shape of `POST /v1/events`, read by the route's own
//!   parser; blank lines are skipped.
//!
//! Every line is bounded ([`MAX_LINE_BYTES`]): a longer NDJSON line is a bad line, a longer
//! CSV line stops the load (a CSV record may not span lines), never a reason to grow memory.
//!
//! A CSV line ends at `\n`, `\r\n` or a lone `\r`, as the csv crate splits records; a record's
//! line number is the line its first byte is on (counted here: the csv crate counts only
//! `\n`s, and its record position stands before any blank lines that precede the record).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tally_core::model::{self as m, RawEvent};

/// The longest line read.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// The most bytes of lines a batch of `tally load` holds (a CSV record's fields, an NDJSON
/// line, as read; a CSV line that is not a record, and a line past `MAX_LINE_BYTES`, weigh
/// nothing): once its lines reach it, a batch ends before `--batch` lines. Lines of wide
/// names (up to 16 values of 2 KB each) would otherwise make the few batches in flight
/// between the reading thread and the loading one hold gigabytes, whatever `--memory-mb`
/// says (a 20 000-line batch of 16 KB lines peaked at 2.7 GB at `--memory-mb 16`, 120 MB
/// since). The default batch of 5 000 lines reaches it only with lines of more than 1.6 KB.
/// Where a batch ends is part of its idempotency key, so a re-run counts once with the same
/// files, `--batch` and a `tally` that cuts batches the same way.
pub const MAX_BATCH_BYTES: usize = 8 << 20;

/// The input's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Csv,
    Ndjson,
}

/// How the bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// What a file's name says: its format (if the name tells) and compression.
pub fn detect(path: &Path) -> (Option<Format>, Compression) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let (rest, compression) = if let Some(r) = name.strip_suffix(".gz") {
        (r.to_owned(), Compression::Gzip)
    } else if let Some(r) = name.strip_suffix(".zst") {
        (r.to_owned(), Compression::Zstd)
    } else {
        (name, Compression::None)
    };
    let format = if rest.ends_with(".csv") {
        Some(Format::Csv)
    } else if rest.ends_with(".ndjson") || rest.ends_with(".jsonl") {
        Some(Format::Ndjson)
    } else {
        None
    };
    (format, compression)
}

/// One input, opened: its bytes decompressed, and how many compressed bytes were read so
/// far (for the progress bar).
pub struct Input {
    pub name: String,
    pub format: Format,
    reader: Box<dyn BufRead + Send>,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("name", &self.name)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    progress: indicatif::ProgressBar,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.inc(n as u64);
        Ok(n)
    }
}

impl Input {
    /// Opens `path` (not `-`: stdin is spooled to a file first by the caller); `format`
    /// overrides what the name says.
    pub fn open(
        path: &Path,
        name: &str,
        format: Option<Format>,
        progress: &indicatif::ProgressBar,
    ) -> anyhow::Result<Input> {
        let (by_name, named) = detect(Path::new(name));
        let Some(format) = format.or(by_name) else {
            bail!(
                "{name}: cannot tell the format from the name (.csv, .ndjson or .jsonl, optionally \
                 .gz or .zst): give --format"
            );
        };
        let mut file = File::open(path).with_context(|| format!("opening {name}"))?;
        let sniffed = sniff(&mut file).with_context(|| format!("reading {name}"))?;
        let compression = match (named, sniffed) {
            (Compression::None, sniffed) => sniffed,
            // Named so, but not: say that, not what decompressing it makes of it.
            (told, sniffed) if told != sniffed => bail!(
                "{name}: not {} data (its first bytes are not the {} magic number)",
                told.label(),
                told.label()
            ),
            (told, _) => told,
        };
        let raw = Counted {
            inner: file,
            progress: progress.clone(),
        };
        let reader: Box<dyn BufRead + Send> = match compression {
            Compression::None => Box::new(BufReader::with_capacity(256 * 1024, raw)),
            Compression::Gzip => Box::new(BufReader::with_capacity(
                256 * 1024,
                flate2::read::MultiGzDecoder::new(BufReader::new(raw)),
            )),
            Compression::Zstd => Box::new(BufReader::with_capacity(
                256 * 1024,
                zstd::stream::read::Decoder::new(raw).with_context(|| format!("opening {name}"))?,
            )),
        };
        Ok(Input {
            name: name.to_owned(),
            format,
            reader,
        })
    }

    /// The records of a CSV input (its header read and checked).
    pub fn csv(self) -> anyhow::Result<CsvRecords> {
        CsvRecords::new(self.reader, &self.name)
    }

    /// Reads the events, calling `each` with (line number, the line's bytes as
    /// [`MAX_BATCH_BYTES`] weighs them, the event or why the line is bad).
    /// An I/O or decompression error stops the read.
    pub fn events(
        self,
        each: &mut dyn FnMut(u64, usize, Result<RawEvent, String>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        // (The reader runs on its own thread in `tally load`: see `cmd::load::each_batch`.)
        let name = self.name.clone();
        match self.format {
            Format::Ndjson => ndjson(self.reader, &name, each),
            Format::Csv => csv(self.reader, &name, each),
        }
    }
}

/// The compression `file`'s first bytes say, the file left at its start.
impl Compression {
    fn label(self) -> &'static str {
        match self {
            Compression::None => "plain",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }
}

fn sniff(file: &mut File) -> io::Result<Compression> {
    let mut head = Vec::with_capacity(4);
    (&mut *file).take(4).read_to_end(&mut head)?;
    file.rewind()?;
    Ok(match head.as_slice() {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd] => Compression::Zstd,
        _ => Compression::None,
    })
}

/// One line into `buf` (without its newline), at most [`MAX_LINE_BYTES`]; `Ok(None)` at the
/// end; `Ok(Some(false))` for a line that was too long (skipped to its end).
fn read_line(r: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<Option<bool>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(any.then_some(!too_long));
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE_BYTES {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Some(!too_long));
        }
    }
}

fn ndjson(
    mut r: Box<dyn BufRead + Send>,
    name: &str,
    each: &mut dyn FnMut(u64, usize, Result<RawEvent, String>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    let mut line = 0u64;
    while let Some(ok) = read_line(&mut *r, &mut buf).with_context(|| format!("reading {name}"))? {
        line += 1;
        if !ok {
            each(
                line,
                0,
                Err(format!("the line is longer than {MAX_LINE_BYTES} bytes")),
            )?;
            continue;
        }
        let mut text = buf.strip_suffix(b"\r").unwrap_or(&buf);
        if line == 1 {
            text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // (The route's parser speaks of "the body".)
        if std::str::from_utf8(text).is_err() {
            each(line, buf.len(), Err("the line is not UTF-8".into()))?;
            continue;
        }
        match tally_server::parse_events(text, true, 1) {
            Ok(mut events) if events.len() == 1 => each(line, buf.len(), Ok(events.remove(0)))?,
            Ok(_) => each(line, buf.len(), Err("not one event".into()))?,
            Err(e) => each(line, buf.len(), Err(e.message))?,
        }
    }
    Ok(())
}

fn csv(
    r: Box<dyn BufRead + Send>,
    name: &str,
    each: &mut dyn FnMut(u64, usize, Result<RawEvent, String>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut records = CsvRecords::new(r, name)?;
    let mut rec = csv::ByteRecord::new();
    while let Some(read) = records.next(&mut rec)? {
        match read {
            Ok(line) => each(line, rec.as_slice().len(), csv_event(&rec, &records.dims))?,
            Err((line, why)) => each(line, 0, Err(why))?,
        }
    }
    Ok(())
}

/// A CSV input's records, after its header.
pub struct CsvRecords {
    /// The dimension columns' names, as the header gives them (unchecked).
    pub dims: Vec<String>,
    rd: csv::Reader<LineBound<Box<dyn BufRead + Send>>>,
    name: String,
}

impl CsvRecords {
    /// Reads and checks the header.
    fn new(r: Box<dyn BufRead + Send>, name: &str) -> anyhow::Result<CsvRecords> {
        // The csv crate holds a whole record: bounding lines and the bytes a record runs over
        // (`LineBound`) bounds records, as no field may hold a line break (keys and values
        // refuse control characters).
        let mut rd = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(true)
            .from_reader(LineBound::new(r));
        let header = rd
            .headers()
            .with_context(|| format!("{name}: reading the CSV header"))?
            .clone();
        let cols: Vec<&str> = header.iter().collect();
        // An empty file (a day's export of nothing) holds no events, as a header alone does.
        if cols.is_empty() {
            return Ok(CsvRecords {
                dims: Vec::new(),
                rd,
                name: name.to_owned(),
            });
        }
        if cols
            .first()
            .is_some_and(|c| c.trim_start().starts_with('{'))
        {
            bail!(
                "{name}:1: this looks like NDJSON (a line starts with {{), not CSV: give \
                 --format ndjson, or name the file .ndjson"
            );
        }
        if cols.len() < 4 || cols[..4] != ["ns", "key", "ts", "n"] {
            bail!(
                "{name}:1: the CSV header must start ns,key,ts,n (then one column per dimension), got {:?}",
                cols.join(",")
            );
        }
        // A dimension given twice would refuse every line that fills both columns, each
        // naming its own line: it is the header's fault, so the header is refused.
        // (Columns without a name, as a trailing comma makes, are no dimension: a line
        // leaving them empty loads, so they may repeat. One pass with a set: a header may
        // be a MiB of columns.)
        let dims: Vec<String> = cols[4..].iter().map(|s| (*s).to_owned()).collect();
        let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (i, d) in dims.iter().enumerate().filter(|(_, d)| !d.is_empty()) {
            // A column that is no dimension name would refuse every line that fills it, each
            // naming its own line (and `--skip-bad` skip them one by one): the header's fault.
            if let Err(e) = m::DimName::new(d) {
                bail!(
                    "{name}:1: the CSV header's column {} ({d:?}) is not a dimension name: {e}",
                    i + 5
                );
            }
            if let Some(was) = first.insert(d.as_str(), i) {
                bail!(
                    "{name}:1: the CSV header gives dimension {d:?} twice (columns {} and {})",
                    was + 5,
                    i + 5
                );
            }
        }
        Ok(CsvRecords {
            dims,
            rd,
            name: name.to_owned(),
        })
    }

    /// The next record into `rec`: `Ok(line)`, or `Err((line, why))` for a line that is not a
    /// CSV record; `None` at the end. An I/O or decompression error stops the read.
    pub fn next(
        &mut self,
        rec: &mut csv::ByteRecord,
    ) -> anyhow::Result<Option<Result<u64, (u64, String)>>> {
        match self.rd.read_byte_record(rec) {
            Ok(false) => Ok(None),
            Ok(true) => {
                let at = rec.position().map_or(0, csv::Position::byte);
                Ok(Some(Ok(self.rd.get_mut().line_at(at))))
            }
            Err(e) => {
                let at = e.position().map_or(0, csv::Position::byte);
                let line = self.rd.get_mut().line_at(at);
                match e.kind() {
                    csv::ErrorKind::Io(_) => {
                        Err(anyhow::anyhow!("{e}")).context(format!("reading {}", self.name))
                    }
                    _ => Ok(Some(Err((line, format!("not a CSV record: {e}"))))),
                }
            }
        }
    }
}

/// One record as an event (its fields checked as text; the event rules come later).
pub fn csv_event(rec: &csv::ByteRecord, dims: &[String]) -> Result<RawEvent, String> {
    if rec.len() != dims.len() + 4 {
        return Err(format!(
            "{} fields, the header has {}",
            rec.len(),
            dims.len() + 4
        ));
    }
    let field = |i: usize| -> Result<&str, String> {
        let b = rec.get(i).unwrap_or_default();
        if b.len() > MAX_LINE_BYTES {
            return Err(format!("a field is longer than {MAX_LINE_BYTES} bytes"));
        }
        std::str::from_utf8(b).map_err(|_| format!("field {} is not UTF-8", i + 1))
    };
    let ts = match field(2)? {
        "" => None,
        t => Some(m::parse_timestamp(t).map_err(|e| format!("ts: {e}"))?),
    };
    let n = match field(3)? {
        "" => None,
        n => Some(
            n.parse::<i64>()
                .map_err(|_| format!("n: {n:?} is not a whole number"))?,
        ),
    };
    let mut event_dims = Vec::new();
    for (i, d) in dims.iter().enumerate() {
        let v = field(4 + i)?;
        if !v.is_empty() {
            event_dims.push((d.clone(), v.to_owned()));
        }
    }
    Ok(RawEvent {
        ns: field(0)?.to_owned(),
        key: field(1)?.to_owned(),
        ts,
        n,
        dims: event_dims,
    })
}

/// Fails the read once a line passes [`MAX_LINE_BYTES`], and notes where the lines that are
/// not blank start, so that a record's line can be told from its byte offset
/// ([`LineBound::line_at`]). A line ends at `\n`, `\r\n` or a lone `\r`.
/// Bytes from the last record's start past which the record being read spans lines: two
/// lines at most, and the csv reader's read-ahead.
const MAX_RECORD_SPAN: u64 = 4 * MAX_LINE_BYTES as u64;

struct LineBound<R> {
    inner: R,
    /// Bytes read so far.
    pos: u64,
    /// The line being read (the first is 1).
    line: u64,
    /// Its bytes read so far, without its end.
    run: usize,
    /// The last byte read was a `\r` (a `\n` next ends the same line).
    after_cr: bool,
    /// (offset, number) of each line that is not blank, from the one the csv reader is in
    /// on: at most one buffer of the csv reader's ahead of it (a record spanning lines adds
    /// its lines).
    starts: VecDeque<(u64, u64)>,
}

impl<R> LineBound<R> {
    fn new(inner: R) -> LineBound<R> {
        LineBound {
            inner,
            pos: 0,
            line: 1,
            run: 0,
            after_cr: false,
            starts: VecDeque::new(),
        }
    }

    /// The line of a record that the csv reader found from byte `at` on: the first line
    /// that is not blank starting there or later (blank lines before a record belong to its
    /// position). Lines before `at` are forgotten: records come in order.
    fn line_at(&mut self, at: u64) -> u64 {
        while let Some(&(start, _)) = self.starts.front()
            && start < at
        {
            self.starts.pop_front();
        }
        self.starts.front().map_or(self.line, |&(_, line)| line)
    }
}

impl<R: Read> Read for LineBound<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let read = buf.get(..n).unwrap_or_default();
        // The bytes before the first line end go on with the current line; each end (a
        // `\r\n` counting once) starts one.
        let (mut from, mut longest, mut longest_at) = (0, 0, self.line);
        for end in memchr::memchr2_iter(b'\n', b'\r', read).chain(std::iter::once(n)) {
            if end > from {
                if self.run == 0 {
                    self.starts.push_back((self.pos + from as u64, self.line));
                }
                self.run += end - from;
                self.after_cr = false;
                if self.run > longest {
                    (longest, longest_at) = (self.run, self.line);
                }
            }
            let Some(&b) = read.get(end) else {
                break;
            };
            if b == b'\r' || !self.after_cr {
                self.line += 1;
            }
            self.run = 0;
            self.after_cr = b == b'\r';
            from = end + 1;
        }
        self.pos += n as u64;
        if longest > MAX_LINE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("line {longest_at} is longer than {MAX_LINE_BYTES} bytes"),
            ));
        }
        // The csv reader holds a record until it ends: one whose quoted field never closes
        // runs on over every later line, each within the line bound. The oldest line start
        // not yet handed out is the last record's (or the one being read): past the last
        // record, this one, and the reader's buffer, the record spans lines.
        if let Some(&(start, _)) = self.starts.front()
            && self.pos - start > MAX_RECORD_SPAN
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a quoted field runs on past its line end (a CSV record may not span lines)",
            ));
        }
        Ok(n)
    }
}

/// XXH3-64 of the input (a specified algorithm: same bytes, same digest, whatever the build),
/// so the idempotency keys of a re-run match the first run's.
#[derive(Clone)]
pub struct Digest(xxhash_rust::xxh3::Xxh3);

impl Default for Digest {
    fn default() -> Self {
        Digest(xxhash_rust::xxh3::Xxh3::new())
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({:016x})", self.value())
    }
}

impl Digest {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn value(&self) -> u64 {
        self.0.digest()
    }
}

/// stdin's copy (see [`spool_stdin`]), held while the load reads it.
#[derive(Debug)]
#[allow(dead_code, reason = "held, never read: dropping it lets the copy go")]
pub enum Spooled {
    /// A file with no name, read again through `/proc/self/fd/N`.
    Unnamed(File),
    /// A named file in a temporary directory removed when this is dropped (no `/proc`).
    Named(tempfile::TempDir),
}

/// Copies stdin into a temporary file (the load may read its input twice); answers it (hold
/// it while the path is read) and a path that opens it again. Where `/proc` is (Linux), the
/// file has no name in any directory (`O_TMPFILE`, or unlinked at once), read again through
/// `/proc/self/fd/N`, so nothing is left behind whatever ends the process — SIGINT and
/// SIGKILL included. Elsewhere it is a named file in a temporary directory, removed when
/// the load ends (a killed load leaves it).
pub fn spool_stdin() -> anyhow::Result<(Spooled, PathBuf)> {
    use std::os::fd::AsRawFd;
    if Path::new("/proc/self/fd").is_dir() {
        let mut f = tempfile::tempfile().context("creating a temporary file for stdin")?;
        io::copy(&mut io::stdin().lock(), &mut f).context("reading stdin")?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        return Ok((Spooled::Unnamed(f), path));
    }
    let dir = tempfile::tempdir().context("creating a temporary directory for stdin")?;
    let path = dir.path().join("stdin");
    let mut f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    io::copy(&mut io::stdin().lock(), &mut f).context("reading stdin")?;
    Ok((Spooled::Named(dir), path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(format: Format, text: &str) -> Vec<(u64, Result<RawEvent, String>)> {
        let dir = tempfile::tempdir().unwrap();
        let name = match format {
            Format::Csv => "x.csv",
            Format::Ndjson => "x.ndjson",
        };
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let input = Input::open(&p, name, None, &indicatif::ProgressBar::hidden()).unwrap();
        let mut out = Vec::new();
        input
            .events(&mut |line, _, e| {
                out.push((line, e));
                Ok(())
            })
            .unwrap();
        out
    }

    /// The events file `p` (named `name`) gives, bad ones as their reasons; or the error
    /// that stops reading it.
    fn events_of(p: &Path, name: &str) -> anyhow::Result<Vec<Result<RawEvent, String>>> {
        let input = Input::open(p, name, None, &indicatif::ProgressBar::hidden())?;
        let mut out = Vec::new();
        input.events(&mut |_, _, e| {
            out.push(e);
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn csv_records_become_events_with_their_line_numbers() {
        let got = read(
            Format::Csv,
            "ns,key,ts,n,country,device\n\
             clicks,lnk_1,1795176000,2,US,\n\
             clicks,\"a,b\",2026-11-20T12:00:00Z,,,mobile\n\
             clicks,k,soon,1,,\n\
             clicks,k,1,x,,\n\
             clicks,k\n",
        );
        assert_eq!(got.len(), 5);
        let e = got[0].1.as_ref().unwrap();
        assert_eq!((got[0].0, e.ts, e.n), (2, Some(1_795_176_000), Some(2)));
        assert_eq!(e.dims, vec![("country".to_owned(), "US".to_owned())]);
        let e = got[1].1.as_ref().unwrap();
        assert_eq!(
            (e.key.as_str(), e.ts, e.n),
            ("a,b", Some(1_795_176_000), None)
        );
        assert!(got[2].1.as_ref().unwrap_err().contains("ts:"));
        assert!(got[3].1.as_ref().unwrap_err().contains("n: \"x\""));
        assert_eq!(got[4].0, 6);
        assert!(got[4].1.as_ref().unwrap_err().contains("2 fields"));
    }

    /// A record's line is the line its first byte is on, whatever ends the lines (`\n`,
    /// `\r\n` or a lone `\r`, as the csv crate splits records), blank lines and records
    /// spanning lines counted (the csv crate's own count missed the `\n` of a header's `\r\n`
    /// and saw no line in a file of lone `\r`s).
    #[test]
    fn csv_line_numbers_count_every_kind_of_line_end() {
        let lines =
            |text: &str| -> Vec<u64> { read(Format::Csv, text).iter().map(|(l, _)| *l).collect() };
        assert_eq!(
            lines("ns,key,ts,n\r\nclicks,k,1,1\r\nclicks,k,soon,1\r\n"),
            vec![2, 3]
        );
        assert_eq!(
            lines("ns,key,ts,n\rclicks,k,1,1\rclicks,k,soon,1\r"),
            vec![2, 3]
        );
        assert_eq!(
            lines("ns,key,ts,n\nclicks,k,1,1\nclicks,k,soon,1"),
            vec![2, 3]
        );
        assert_eq!(
            lines("ns,key,ts,n\n\nclicks,k,1,1\n\r\n\nclicks,\"a\nb\",1,1\nclicks,k,2,1"),
            vec![3, 6, 8]
        );
        assert_eq!(
            lines("ns,key,ts,n\r\rclicks,k,1,1\n\rclicks,k,1,1\r\r\n"),
            vec![3, 5]
        );
        let bad = read(
            Format::Csv,
            "ns,key,ts,n\r\nclicks,k,1,1\r\nclicks,k,soon,1\r\n",
        );
        assert!(bad[1].1.as_ref().unwrap_err().contains("ts:"), "{bad:?}");
    }

    /// A file of lone `\r` line ends longer than one line's bound reads line by line.
    #[test]
    fn a_csv_of_lone_carriage_returns_is_read_line_by_line() {
        let rows = MAX_LINE_BYTES / 10;
        let text = format!("ns,key,ts,n\r{}", "clicks,k,1,1\r".repeat(rows));
        let got = read(Format::Csv, &text);
        assert_eq!(got.len(), rows);
        assert!(got.iter().all(|(_, e)| e.is_ok()));
        assert_eq!(got.last().map(|(l, _)| *l), Some(rows as u64 + 1));
    }

    /// A file named .gz or .zst that is not: said so, rather than what decompressing it
    /// makes of it ("unexpected end of file", found by a review).
    #[test]
    fn a_file_named_compressed_that_is_not_says_so() {
        let dir = tempfile::tempdir().unwrap();
        for (name, what) in [
            ("x.csv.gz", "not gzip data"),
            ("x.csv.zst", "not zstd data"),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, "ns,key,ts,n\nclicks,k,1,1\n").unwrap();
            let err = Input::open(&p, name, None, &indicatif::ProgressBar::hidden())
                .err()
                .map(|e| format!("{e:#}"));
            assert!(err.as_deref().is_some_and(|e| e.contains(what)), "{err:?}");
        }
    }

    #[test]
    fn a_csv_line_past_the_bound_stops_the_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.csv");
        // An unclosed quote would otherwise make the csv crate hold the rest of the file.
        let text = format!(
            "ns,key,ts,n\nclicks,\"{}\n",
            "k".repeat(MAX_LINE_BYTES + 10)
        );
        std::fs::write(&p, text).unwrap();
        let err = events_of(&p, "x.csv").unwrap_err();
        assert!(
            format!("{err:#}").contains("line 2 is longer than"),
            "{err:#}"
        );
        // Exactly the bound is a line.
        let ok = format!("ns,key,ts,n\nc,{},1,1\n", "k".repeat(MAX_LINE_BYTES - 7));
        std::fs::write(&p, ok).unwrap();
        assert_eq!(events_of(&p, "x.csv").unwrap().len(), 1);
        // An unclosed quote followed by many short lines: refused once it has run past the
        // record bound, not held whole (5 MiB of lines here).
        let text = format!("ns,key,ts,n\nclicks,\"k\n{}", "x,1,1\n".repeat(900_000));
        std::fs::write(&p, text).unwrap();
        let err = events_of(&p, "x.csv").unwrap_err();
        assert!(format!("{err:#}").contains("may not span lines"), "{err:#}");
    }

    /// The bound holds however the reads cut the lines: a line may span reads, and a read
    /// may end on a newline or hold several.
    #[test]
    fn the_line_bound_counts_lines_across_reads() {
        struct Pieces<'a>(&'a [u8], usize);
        impl Read for Pieces<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.1.min(buf.len()).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let longest = |text: &[u8], piece: usize| -> io::Result<()> {
            let mut r = LineBound::new(Pieces(text, piece));
            io::copy(&mut r, &mut io::sink()).map(|_| ())
        };
        let line = "x".repeat(MAX_LINE_BYTES);
        for end in ["\n", "\r\n", "\r"] {
            let fits = format!("a{end}{line}{end}b{end}{end}{line}");
            let over = format!("a{end}{line}x{end}b{end}");
            for piece in [1, 7, 4096, MAX_LINE_BYTES, 3 * MAX_LINE_BYTES] {
                assert!(longest(fits.as_bytes(), piece).is_ok(), "{end:?} {piece}");
                assert!(longest(over.as_bytes(), piece).is_err(), "{end:?} {piece}");
            }
        }
    }

    #[test]
    fn a_csv_header_must_start_with_the_event_columns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.csv");
        std::fs::write(&p, "key,ns,ts,n\n").unwrap();
        let err = events_of(&p, "x.csv").unwrap_err();
        assert!(err.to_string().contains("must start ns,key,ts,n"), "{err}");
        // NDJSON read as CSV (`--format csv`, or a .csv name) is said to be NDJSON: the
        // header quoted back had lost its quotes to the CSV parser.
        std::fs::write(&p, "{\"ns\":\"x\",\"key\":\"k\"}\n").unwrap();
        let err = events_of(&p, "x.csv").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("x.csv:1: this looks like NDJSON (a line starts with {), not CSV"),
            "{err}"
        );
    }

    /// A dimension named twice is the header's fault: refused at line 1, not at each line
    /// that fills both columns.
    #[test]
    fn a_csv_header_may_not_name_a_dimension_twice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dup.csv");
        std::fs::write(&p, "ns,key,ts,n,country,device,country\nc,k,5,1,US,tv,DE\n").unwrap();
        let err = events_of(&p, "dup.csv").unwrap_err();
        assert_eq!(
            err.to_string(),
            "dup.csv:1: the CSV header gives dimension \"country\" twice (columns 5 and 7)"
        );
        // Unnamed columns (trailing commas) may repeat, left empty.
        let p = dir.path().join("trailing.csv");
        std::fs::write(&p, "ns,key,ts,n,country,,\nc,k,5,1,US,,\n").unwrap();
        let got = events_of(&p, "trailing.csv").unwrap();
        assert!(got.len() == 1 && got[0].is_ok(), "{got:?}");
    }

    /// So is a column that is no dimension name: it refused each line filling it, at that
    /// line (and `--skip-bad` skipped them one by one), and loaded a file leaving it empty
    /// (found by a review).
    #[test]
    fn a_csv_header_names_only_dimensions() {
        let dir = tempfile::tempdir().unwrap();
        for (column, why) in [
            ("Country", "only a-z, 0-9 and '_' are allowed"),
            ("bad-name", "only a-z, 0-9 and '_' are allowed"),
        ] {
            let p = dir.path().join("h.csv");
            std::fs::write(
                &p,
                format!(
                    "ns,key,ts,n,country,{column}
c,k,5,1,US,
"
                ),
            )
            .unwrap();
            let err = events_of(&p, "h.csv").unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "h.csv:1: the CSV header's column 6 ({column:?}) is not a dimension name"
                )) && err.contains(why),
                "{err}"
            );
        }
    }

    /// An NDJSON line that is not UTF-8 is said to be one (it was "the body is not UTF-8",
    /// the route's words).
    #[test]
    fn an_ndjson_line_not_utf8_is_named_as_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.ndjson");
        std::fs::write(
            &p,
            b"{\"ns\":\"a\",\"key\":\"k\"}\n{\"ns\":\"a\",\"key\":\"\xff\"}\n",
        )
        .unwrap();
        let got = events_of(&p, "x.ndjson").unwrap();
        assert!(got[0].is_ok(), "{got:?}");
        assert_eq!(got[1], Err("the line is not UTF-8".to_owned()));
    }

    /// An empty file holds no events, as a header alone does (it was "the CSV header must
    /// start ns,key,ts,n …, got \"\"", and failed a load of several files).
    #[test]
    fn an_empty_csv_file_holds_no_events() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [("empty.csv", ""), ("header.csv", "ns,key,ts,n\n")] {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            assert_eq!(events_of(&p, name).unwrap().len(), 0, "{name}");
        }
    }

    #[test]
    fn ndjson_lines_use_the_routes_parser_and_skip_blanks() {
        let long = format!(
            "{{\"ns\":\"a\",\"key\":\"{}\"}}",
            "k".repeat(MAX_LINE_BYTES)
        );
        let got = read(
            Format::Ndjson,
            &format!(
                "{{\"ns\":\"clicks\",\"key\":\"k\",\"ts\":5,\"dims\":{{\"c\":\"x\"}}}}\n\n  \n\
                 {{\"ns\":\"clicks\"}}\n[1]\n{long}\n{{\"ns\":\"a\",\"key\":\"b\"}}"
            ),
        );
        let lines: Vec<u64> = got.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, vec![1, 4, 5, 6, 7]);
        assert!(got[0].1.is_ok());
        assert!(
            got[1].1.as_ref().unwrap_err().contains("key"),
            "{:?}",
            got[1]
        );
        assert!(got[2].1.is_err());
        assert!(got[3].1.as_ref().unwrap_err().contains("longer than"));
        assert_eq!(got[4].1.as_ref().unwrap().key, "b");
    }

    #[test]
    fn names_tell_format_and_compression() {
        assert_eq!(
            detect(Path::new("a/b.CSV.gz")),
            (Some(Format::Csv), Compression::Gzip)
        );
        assert_eq!(
            detect(Path::new("e.jsonl.zst")),
            (Some(Format::Ndjson), Compression::Zstd)
        );
        assert_eq!(detect(Path::new("e.txt")), (None, Compression::None));
    }

    /// Compression is told by the first bytes when the name does not tell: stdin (spooled to a
    /// file named `stdin`) and a file named without `.gz` or `.zst` (the first cut read their
    /// compressed bytes as text and refused the header).
    #[test]
    fn compressed_inputs_without_a_telling_name_are_told_by_their_bytes() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let text = "ns,key,ts,n\nclicks,k,5,1\nclicks,k,6,2\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        gz.write_all(text.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::encode_all(text.as_bytes(), 3).unwrap();
        for (bytes, what) in [
            (gz, "gzip"),
            (zst, "zstd"),
            (text.as_bytes().to_vec(), "plain"),
        ] {
            for name in ["stdin", "a.csv"] {
                let p = dir.path().join(name);
                std::fs::write(&p, &bytes).unwrap();
                let input = Input::open(
                    &p,
                    name,
                    Some(Format::Csv),
                    &indicatif::ProgressBar::hidden(),
                )
                .unwrap();
                let mut n = 0;
                input
                    .events(&mut |_, _, e| {
                        n += e.unwrap().n.unwrap();
                        Ok(())
                    })
                    .unwrap_or_else(|e| panic!("{what} {name}: {e:#}"));
                assert_eq!(n, 3, "{what} {name}");
            }
        }
    }

    /// A UTF-8 byte order mark before the first line is skipped, in NDJSON as in CSV.
    #[test]
    fn a_byte_order_mark_is_skipped() {
        let got = read(
            Format::Ndjson,
            "\u{feff}{\"ns\":\"clicks\",\"key\":\"k\",\"ts\":5}\n{\"ns\":\"clicks\",\"key\":\"j\"}\n",
        );
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|(_, e)| e.is_ok()), "{got:?}");
        let got = read(Format::Csv, "\u{feff}ns,key,ts,n\nclicks,k,5,1\n");
        assert_eq!(got.len(), 1);
        assert!(got[0].1.is_ok(), "{got:?}");
    }

    #[test]
    fn compressed_inputs_read_like_plain_ones() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let text = "ns,key,ts,n\nclicks,k,5,1\nclicks,k,6,2\n";
        let gz = dir.path().join("a.csv.gz");
        let mut e = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), Default::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap();
        let zst = dir.path().join("a.csv.zst");
        std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
        for (p, name) in [(gz, "a.csv.gz"), (zst, "a.csv.zst")] {
            let input = Input::open(&p, name, None, &indicatif::ProgressBar::hidden()).unwrap();
            let mut n = 0;
            input
                .events(&mut |_, _, e| {
                    n += e.unwrap().n.unwrap();
                    Ok(())
                })
                .unwrap();
            assert_eq!(n, 3, "{name}");
        }
    }
}
