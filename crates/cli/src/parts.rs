//! Hive-style partitioned files for `tally export`: `<out>/ns=<ns>/date=<YYYY-MM-DD>/part-<N>.<ext>`
//! (the UTC date of each row's bucket), in Parquet or CSV, readable as they are by DuckDB,
//! Athena and Spark. The partition columns (`ns`, `date`) are in the path only, as those tools
//! expect; a file holds `key, ts, resolution, dim, value, n`.
//!
//! Rows arrive key by key, so every date's partition can get rows at any time. Memory and
//! descriptors stay bounded whatever the export's size: at most [`MAX_OPEN`] partitions have
//! a file open (opening another closes the one used longest ago; its date's next rows go to a
//! new `part-<N+1>` file), and Parquet rows wait in memory at most [`ROW_GROUP_ROWS`] (and
//! [`ROW_GROUP_BYTES`]) per partition and [`BUFFERED_BYTES`] in all before they are written
//! as a row group: bytes as well as rows, since a row holds a key of up to 256 bytes and a
//! value of up to 2 048 (half a million wide rows held 1.1 GB, found by a review).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;
use tally_core::query::csv_field;

/// Partitions with an open file at most.
pub const MAX_OPEN: usize = 64;
/// Rows in one Parquet row group at most.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Bytes of one Parquet row group's buffered rows at most (see [`row_bytes`]).
pub const ROW_GROUP_BYTES: usize = 32 << 20;
/// Bytes of Parquet rows waiting in memory, over every partition, at most.
pub const BUFFERED_BYTES: usize = 128 << 20;

/// What a buffered Parquet row holds in memory: its strings, and about 240 bytes of their
/// four buffers and two numbers.
fn row_bytes(row: &Row<'_>) -> usize {
    240 + row.key.len() + row.resolution.len() + row.dim.len() + row.value.len()
}

/// The file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Parquet,
    Csv,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
        }
    }
}

/// One row, without its partition columns.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub key: &'a str,
    pub ts: i64,
    pub resolution: &'a str,
    pub dim: &'a str,
    pub value: &'a str,
    pub n: i64,
}

/// The writer of one namespace's partitions under `dir` (`<out>/ns=<ns>`).
#[derive(Debug)]
pub struct Parts {
    dir: PathBuf,
    format: Format,
    open: HashMap<i64, Open>,
    /// The next part number of each date seen.
    next_part: HashMap<i64, u32>,
    /// Bytes of the rows buffered in every open Parquet partition.
    buffered: usize,
    clock: u64,
    pub rows: u64,
    pub files: u64,
}

#[derive(Debug)]
struct Open {
    file: PartFile,
    used: u64,
}

impl Parts {
    pub fn new(dir: &Path, format: Format) -> Parts {
        Parts {
            dir: dir.to_owned(),
            format,
            open: HashMap::new(),
            next_part: HashMap::new(),
            buffered: 0,
            clock: 0,
            rows: 0,
            files: 0,
        }
    }

    pub fn write(&mut self, row: &Row<'_>) -> anyhow::Result<()> {
        let day = row.ts.div_euclid(86_400);
        self.clock += 1;
        if !self.open.contains_key(&day) {
            if self.open.len() >= MAX_OPEN {
                self.close_oldest()?;
            }
            let part = self.next_part.entry(day).or_insert(0);
            let dir = self.dir.join(format!("date={}", date(day)));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("part-{part}.{}", self.format.ext()));
            *part += 1;
            self.files += 1;
            let file = PartFile::create(&path, self.format)?;
            self.open.insert(day, Open { file, used: 0 });
        }
        let open = self
            .open
            .get_mut(&day)
            .context("a partition just opened is gone")?;
        open.used = self.clock;
        let grew = open.file.write(row)?;
        self.buffered = self.buffered + grew.added - grew.flushed;
        self.rows += 1;
        if self.buffered > BUFFERED_BYTES {
            // Write out the partition holding the most.
            if let Some(o) = self.open.values_mut().max_by_key(|o| o.file.buffered()) {
                self.buffered -= o.file.flush_rows()?;
            }
        }
        Ok(())
    }

    fn close_oldest(&mut self) -> anyhow::Result<()> {
        let oldest = self
            .open
            .iter()
            .min_by_key(|(_, o)| o.used)
            .map(|(day, _)| *day);
        if let Some(o) = oldest.and_then(|day| self.open.remove(&day)) {
            self.buffered -= o.file.buffered();
            o.file.finish()?;
        }
        Ok(())
    }

    /// Writes what is buffered and closes every open file (a date written to later gets a
    /// new part).
    pub fn close_all(&mut self) -> anyhow::Result<()> {
        for (_, o) in self.open.drain() {
            o.file.finish()?;
        }
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and closes every file.
    pub fn finish(mut self) -> anyhow::Result<(u64, u64)> {
        for (_, o) in self.open.drain() {
            o.file.finish()?;
        }
        Ok((self.rows, self.files))
    }
}

/// `YYYY-MM-DD` of a day number since 1970-01-01 (civil-from-days, proleptic Gregorian).
pub fn date(day: i64) -> String {
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}")
}

/// How a write changed the bytes of rows buffered.
struct Grew {
    added: usize,
    flushed: usize,
}

#[derive(Debug)]
enum PartFile {
    Csv(BufWriter<File>, PathBuf),
    Parquet(Box<ParquetPart>),
}

impl PartFile {
    fn create(path: &Path, format: Format) -> anyhow::Result<PartFile> {
        let file =
            File::create_new(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(match format {
            Format::Csv => {
                let mut w = BufWriter::with_capacity(64 * 1024, file);
                w.write_all(b"key,ts,resolution,dim,value,n\n")?;
                PartFile::Csv(w, path.to_owned())
            }
            Format::Parquet => PartFile::Parquet(Box::new(ParquetPart::new(file, path)?)),
        })
    }

    fn write(&mut self, row: &Row<'_>) -> anyhow::Result<Grew> {
        match self {
            PartFile::Csv(w, path) => {
                let mut line = String::with_capacity(64);
                csv_field(&mut line, row.key);
                line.push_str(&format!(",{},{},", row.ts, row.resolution));
                csv_field(&mut line, row.dim);
                line.push(',');
                csv_field(&mut line, row.value);
                line.push_str(&format!(",{}\n", row.n));
                w.write_all(line.as_bytes())
                    .with_context(|| format!("writing {}", path.display()))?;
                Ok(Grew {
                    added: 0,
                    flushed: 0,
                })
            }
            PartFile::Parquet(p) => p.push(row),
        }
    }

    fn buffered(&self) -> usize {
        match self {
            PartFile::Csv(..) => 0,
            PartFile::Parquet(p) => p.bytes,
        }
    }

    fn flush_rows(&mut self) -> anyhow::Result<usize> {
        match self {
            PartFile::Csv(..) => Ok(0),
            PartFile::Parquet(p) => p.row_group(),
        }
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            PartFile::Csv(mut w, path) => {
                w.flush()
                    .with_context(|| format!("writing {}", path.display()))?;
                w.into_inner()
                    .map_err(|e| e.into_error())
                    .and_then(|f| f.sync_all())
                    .with_context(|| format!("writing {}", path.display()))
            }
            PartFile::Parquet(p) => p.finish(),
        }
    }
}

/// One Parquet file: rows buffered by column, written a row group at a time.
struct ParquetPart {
    writer: SerializedFileWriter<File>,
    path: PathBuf,
    key: Vec<ByteArray>,
    ts: Vec<i64>,
    resolution: Vec<ByteArray>,
    dim: Vec<ByteArray>,
    value: Vec<ByteArray>,
    n: Vec<i64>,
    /// [`row_bytes`] of the rows buffered.
    bytes: usize,
}

impl std::fmt::Debug for ParquetPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetPart")
            .field("path", &self.path)
            .field("rows", &self.ts.len())
            .finish_non_exhaustive()
    }
}

fn schema() -> anyhow::Result<Arc<Type>> {
    let message = "message tally_export {
        required binary key (STRING);
        required int64 ts;
        required binary resolution (STRING);
        required binary dim (STRING);
        required binary value (STRING);
        required int64 n;
    }";
    Ok(Arc::new(parquet::schema::parser::parse_message_type(
        message,
    )?))
}

impl ParquetPart {
    fn new(file: File, path: &Path) -> anyhow::Result<ParquetPart> {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_created_by(format!("tally {}", env!("CARGO_PKG_VERSION")))
            .build();
        let writer = SerializedFileWriter::new(file, schema()?, Arc::new(props))
            .with_context(|| format!("starting {}", path.display()))?;
        Ok(ParquetPart {
            writer,
            path: path.to_owned(),
            key: Vec::new(),
            ts: Vec::new(),
            resolution: Vec::new(),
            dim: Vec::new(),
            value: Vec::new(),
            n: Vec::new(),
            bytes: 0,
        })
    }

    fn rows(&self) -> usize {
        self.ts.len()
    }

    fn push(&mut self, row: &Row<'_>) -> anyhow::Result<Grew> {
        let size = row_bytes(row);
        self.bytes += size;
        let b = |s: &str| ByteArray::from(s.as_bytes().to_vec());
        self.key.push(b(row.key));
        self.ts.push(row.ts);
        self.resolution.push(b(row.resolution));
        self.dim.push(b(row.dim));
        self.value.push(b(row.value));
        self.n.push(row.n);
        let flushed = if self.rows() >= ROW_GROUP_ROWS || self.bytes >= ROW_GROUP_BYTES {
            self.row_group()?
        } else {
            0
        };
        Ok(Grew {
            added: size,
            flushed,
        })
    }

    /// Writes the buffered rows as one row group; answers their [`row_bytes`].
    fn row_group(&mut self) -> anyhow::Result<usize> {
        if self.rows() == 0 {
            return Ok(0);
        }
        let bytes = std::mem::take(&mut self.bytes);
        let path = self.path.display().to_string();
        let mut rg = self
            .writer
            .next_row_group()
            .with_context(|| format!("writing {path}"))?;
        let mut i = 0;
        while let Some(mut col) = rg
            .next_column()
            .with_context(|| format!("writing {path}"))?
        {
            let strings = |v: &mut Vec<ByteArray>| std::mem::take(v);
            let written = match i {
                0 => col
                    .typed::<ByteArrayType>()
                    .write_batch(&strings(&mut self.key), None, None),
                1 => {
                    col.typed::<Int64Type>()
                        .write_batch(&std::mem::take(&mut self.ts), None, None)
                }
                2 => col.typed::<ByteArrayType>().write_batch(
                    &strings(&mut self.resolution),
                    None,
                    None,
                ),
                3 => col
                    .typed::<ByteArrayType>()
                    .write_batch(&strings(&mut self.dim), None, None),
                4 => {
                    col.typed::<ByteArrayType>()
                        .write_batch(&strings(&mut self.value), None, None)
                }
                _ => col
                    .typed::<Int64Type>()
                    .write_batch(&std::mem::take(&mut self.n), None, None),
            };
            written.with_context(|| format!("writing {path}"))?;
            col.close().with_context(|| format!("writing {path}"))?;
            i += 1;
        }
        rg.close().with_context(|| format!("writing {path}"))?;
        Ok(bytes)
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.row_group()?;
        let path = self.path.clone();
        let file = self
            .writer
            .into_inner()
            .with_context(|| format!("finishing {}", path.display()))?;
        file.sync_all()
            .with_context(|| format!("writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ts: i64) -> Row<'static> {
        Row {
            key: "k,1",
            ts,
            resolution: "1h",
            dim: "",
            value: "",
            n: 1,
        }
    }

    #[test]
    fn partitions_past_max_open_go_on_in_new_parts() {
        let dir = tempfile::tempdir().unwrap();
        let mut parts = Parts::new(dir.path(), Format::Csv);
        let days = MAX_OPEN as i64 + 1;
        // Two rounds over every day: the second round reopens each evicted day.
        for round in 0..2 {
            for d in 0..days {
                parts.write(&row(d * 86_400 + round)).unwrap();
            }
        }
        let (rows, files) = parts.finish().unwrap();
        assert_eq!(rows, 2 * days as u64);
        assert!(files > days as u64, "{files}");
        let mut lines = 0;
        for d in 0..days {
            let part_dir = dir.path().join(format!("date={}", date(d)));
            for f in std::fs::read_dir(&part_dir).unwrap() {
                let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
                assert!(text.starts_with("key,ts,resolution,dim,value,n\n"));
                lines += text.lines().count() - 1;
            }
        }
        assert_eq!(lines, 2 * days as usize);
        assert!(dir.path().join("date=1970-01-01/part-1.csv").exists());
    }

    #[test]
    fn parquet_rows_come_back_from_row_groups() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let mut parts = Parts::new(dir.path(), Format::Parquet);
        let n = ROW_GROUP_ROWS + 10;
        for i in 0..n {
            parts.write(&row(i as i64 % 86_400)).unwrap();
        }
        parts.finish().unwrap();
        let file = File::open(dir.path().join("date=1970-01-01/part-0.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups(), 2);
        assert_eq!(meta.file_metadata().num_rows(), n as i64);
    }

    /// Wide rows make row groups by their bytes, far below the row count.
    #[test]
    fn wide_parquet_rows_are_written_by_their_bytes() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let mut parts = Parts::new(dir.path(), Format::Parquet);
        let (key, value) = ("k".repeat(256), "v".repeat(2048));
        let n = 40_000;
        for i in 0..n {
            let r = Row {
                key: &key,
                ts: i as i64 % 86_400,
                resolution: "1h",
                dim: "referrer",
                value: &value,
                n: 1,
            };
            parts.write(&r).unwrap();
            assert!(parts.buffered <= ROW_GROUP_BYTES, "{}", parts.buffered);
        }
        parts.finish().unwrap();
        let file = File::open(dir.path().join("date=1970-01-01/part-0.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let meta = reader.metadata();
        assert!(meta.num_row_groups() >= 3, "{}", meta.num_row_groups());
        assert_eq!(meta.file_metadata().num_rows(), n as i64);
    }

    #[test]
    fn dates_of_day_numbers() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(1_795_176_000 / 86_400), "2026-11-20");
        assert_eq!(date(11_016), "2000-02-29");
        assert_eq!(date(-1), "1969-12-31");
    }
}
