//! YCSB's `CoreWorkload`: what to load and which operations to run, with which keys and values.
//!
//! Shared state ([`CoreWorkload`]) holds the configuration and the two key counters; each client
//! thread owns a [`ThreadState`] with its RNG and its own clones of the key, field and scan-length
//! choosers. The logic follows `site.ycsb.workloads.CoreWorkload`:
//!
//! - **Keys.** Key number `n` becomes `"user" + n` (`insertorder=ordered`) or
//!   `"user" + fnv_hash64(n)` (`insertorder=hashed`, the default), zero-padded to `zeropadding`
//!   digits (default 1: no padding).
//! - **Load.** Each insert takes the next number from a counter starting at `insertstart` and
//!   writes all `fieldcount` fields of random bytes, retrying `insertionretrylimit` times.
//!   A thread stops at its first insert that still fails, as YCSB's does.
//! - **Run.** The operation comes from a discrete chooser over READ, UPDATE, INSERT, SCAN and
//!   READMODIFYWRITE (that order). Keys for reads, updates, scans and read-modify-writes come
//!   from the request distribution (`uniform`, `zipfian`, `latest`) and are redrawn while they
//!   exceed the highest contiguously acknowledged insert, so no operation targets a key whose
//!   insert has not finished. Inserts take numbers from an acknowledged counter starting at
//!   `recordcount` and acknowledge them whether or not they succeeded.
//! - **Zipfian key space.** The scrambled zipfian covers `insertcount + expectednewkeys + 1` key
//!   numbers from `insertstart`, where `expectednewkeys = operationcount × insertproportion × 2`,
//!   so popular keys stay popular as inserts grow the table.
//! - **Values.** YCSB's `RandomByteIterator` bytes: six characters per random 32-bit integer,
//!   each `' ' + (bits & mask)`.
//!
//! Not done (refused with an error rather than silently ignored): request distributions
//! `hotspot`, `sequential` and `exponential`; `dataintegrity`; `fieldlengthdistribution=zipfian`
//! and `histogram`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use rand::rngs::StdRng;
use rand::Rng;

use crate::generator::{
    fnv_hash64, AcknowledgedCounter, CounterGenerator, DiscreteGenerator,
    ScrambledZipfianGenerator, SkewedLatestGenerator, UniformLongGenerator, ZipfianGenerator,
};
use crate::measurements::OpKind;
use crate::properties::Properties;
use crate::record::Record;
use crate::wrapper::{micros_between, MeasuredDb};

/// Redraws allowed for one key before the run is aborted (a key chooser that keeps producing
/// unacknowledged keys means the properties are inconsistent, e.g. `insertstart` too high).
pub const MAX_KEY_DRAW_ATTEMPTS: u32 = 100_000;
/// Largest `fieldcount` accepted.
pub const MAX_FIELD_COUNT: u64 = 1_000;
/// Largest `fieldlength` / `maxfieldlength` accepted, in bytes.
pub const MAX_FIELD_LENGTH_BYTES: u64 = 64 * 1024;
/// Largest `maxscanlength` accepted.
pub const MAX_SCAN_LENGTH: u64 = 10_000;

/// A transaction-phase operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

#[derive(Debug, Clone)]
enum KeyChooser {
    Uniform(UniformLongGenerator),
    Zipfian(ScrambledZipfianGenerator),
    Latest(SkewedLatestGenerator),
}

#[derive(Debug, Clone)]
enum ScanLength {
    Uniform(UniformLongGenerator),
    Zipfian(ZipfianGenerator),
}

#[derive(Debug, Clone)]
enum FieldLength {
    Constant(u64),
    Uniform(UniformLongGenerator),
}

/// Shared workload state.
#[derive(Debug)]
pub struct CoreWorkload {
    table: String,
    field_names: Vec<String>,
    field_length: FieldLength,
    read_all_fields: bool,
    read_all_fields_by_name: bool,
    write_all_fields: bool,
    ordered_inserts: bool,
    zero_padding: usize,
    operation_chooser: DiscreteGenerator<Operation>,
    key_chooser: KeyChooser,
    field_chooser: UniformLongGenerator,
    scan_length: ScanLength,
    key_sequence: CounterGenerator,
    insert_key_sequence: Arc<AcknowledgedCounter>,
    insertion_retry_limit: u32,
    insertion_retry_interval: Duration,
    record_count: u64,
    insert_start: u64,
    insert_count: u64,
}

/// One client thread's generators and RNG.
#[derive(Debug)]
pub struct ThreadState {
    rng: StdRng,
    key_chooser: KeyChooser,
    scan_length: ScanLength,
    field_length: FieldLength,
}

fn count(properties: &Properties, key: &str, default: u64) -> anyhow::Result<u64> {
    Ok(properties.parse_or(key, default, "non-negative integer")?)
}

fn proportion(properties: &Properties, key: &str, default: f64) -> anyhow::Result<f64> {
    let value: f64 = properties.parse_or(key, default, "number")?;
    if !(0.0..=1.0).contains(&value) {
        bail!("{key}={value} must be between 0 and 1");
    }
    Ok(value)
}

impl CoreWorkload {
    /// Builds the workload from properties (YCSB's `CoreWorkload.init`).
    pub fn new(properties: &Properties) -> anyhow::Result<Self> {
        if let Some(class) = properties.get("workload") {
            let class = class.trim();
            if !class.ends_with(".workloads.CoreWorkload") && class != "CoreWorkload" {
                bail!("workload={class} is not supported; only CoreWorkload is ported");
            }
        }
        if properties.bool_or("dataintegrity", false) {
            bail!("dataintegrity=true is not supported by this port");
        }
        let table = properties.get_or("table", "usertable").to_string();
        let field_count = count(properties, "fieldcount", 10)?;
        if field_count == 0 || field_count > MAX_FIELD_COUNT {
            bail!("fieldcount={field_count} must be between 1 and {MAX_FIELD_COUNT}");
        }
        let prefix = properties.get_or("fieldnameprefix", "field");
        let field_names = (0..field_count).map(|i| format!("{prefix}{i}")).collect();
        let field_length = match properties.get_or("fieldlengthdistribution", "constant") {
            "constant" => FieldLength::Constant(count(properties, "fieldlength", 100)?),
            "uniform" => {
                let min = count(properties, "minfieldlength", 1)?;
                let max = count(properties, "fieldlength", 100)?;
                if min > max {
                    bail!("minfieldlength={min} exceeds fieldlength={max}");
                }
                FieldLength::Uniform(UniformLongGenerator::new(min, max))
            }
            other => bail!("fieldlengthdistribution={other} is not supported (constant, uniform)"),
        };
        let longest_field = match &field_length {
            FieldLength::Constant(len) => *len,
            FieldLength::Uniform(_) => count(properties, "fieldlength", 100)?,
        };
        if longest_field > MAX_FIELD_LENGTH_BYTES {
            bail!("fieldlength={longest_field} exceeds {MAX_FIELD_LENGTH_BYTES}");
        }

        let record_count = count(properties, "recordcount", 0)?;
        let insert_start = count(properties, "insertstart", 0)?;
        let insert_count = count(
            properties,
            "insertcount",
            record_count.saturating_sub(insert_start),
        )?;
        let operation_count = count(properties, "operationcount", 0)?;

        let read_proportion = proportion(properties, "readproportion", 0.95)?;
        let update_proportion = proportion(properties, "updateproportion", 0.05)?;
        let insert_proportion = proportion(properties, "insertproportion", 0.0)?;
        let scan_proportion = proportion(properties, "scanproportion", 0.0)?;
        let read_modify_write_proportion =
            proportion(properties, "readmodifywriteproportion", 0.0)?;
        let operation_chooser = DiscreteGenerator::new([
            (read_proportion, Operation::Read),
            (update_proportion, Operation::Update),
            (insert_proportion, Operation::Insert),
            (scan_proportion, Operation::Scan),
            (read_modify_write_proportion, Operation::ReadModifyWrite),
        ])
        .map_err(|error| anyhow!("operation proportions: {error}"))?;

        let ordered_inserts = properties.get_or("insertorder", "hashed") != "hashed";
        let zero_padding = count(properties, "zeropadding", 1)? as usize;

        let insert_key_sequence = Arc::new(AcknowledgedCounter::new(record_count));
        let distribution = properties.get_or("requestdistribution", "uniform");
        let key_chooser = match distribution {
            "uniform" => {
                if insert_count == 0 {
                    bail!("requestdistribution=uniform needs insertcount/recordcount >= 1");
                }
                KeyChooser::Uniform(UniformLongGenerator::new(
                    insert_start,
                    insert_start + insert_count - 1,
                ))
            }
            "zipfian" => {
                // YCSB: (int) (opcount * insertproportion * 2.0), 2 being a fudge factor.
                let expected_new_keys = (operation_count as f64 * insert_proportion * 2.0) as u64;
                KeyChooser::Zipfian(ScrambledZipfianGenerator::new(
                    insert_start,
                    insert_start + insert_count + expected_new_keys,
                ))
            }
            "latest" => KeyChooser::Latest(SkewedLatestGenerator::new(&insert_key_sequence)),
            other => {
                bail!("requestdistribution={other} is not supported (uniform, zipfian, latest)")
            }
        };

        let min_scan_length = count(properties, "minscanlength", 1)?;
        let max_scan_length = count(properties, "maxscanlength", 1000)?;
        if min_scan_length == 0 || min_scan_length > max_scan_length {
            bail!("scan lengths must satisfy 1 <= minscanlength={min_scan_length} <= maxscanlength={max_scan_length}");
        }
        if max_scan_length > MAX_SCAN_LENGTH {
            bail!("maxscanlength={max_scan_length} exceeds {MAX_SCAN_LENGTH}");
        }
        let scan_length = match properties.get_or("scanlengthdistribution", "uniform") {
            "uniform" => {
                ScanLength::Uniform(UniformLongGenerator::new(min_scan_length, max_scan_length))
            }
            "zipfian" => {
                ScanLength::Zipfian(ZipfianGenerator::new(min_scan_length, max_scan_length))
            }
            other => bail!("scanlengthdistribution={other} is not supported (uniform, zipfian)"),
        };

        let retry_interval_secs = count(properties, "insertionretryinterval", 3)?;
        Ok(Self {
            table,
            field_names,
            field_length,
            read_all_fields: properties.bool_or("readallfields", true),
            read_all_fields_by_name: properties.bool_or("readallfieldsbyname", false),
            write_all_fields: properties.bool_or("writeallfields", false),
            ordered_inserts,
            zero_padding,
            operation_chooser,
            key_chooser,
            field_chooser: UniformLongGenerator::new(0, field_count - 1),
            scan_length,
            key_sequence: CounterGenerator::new(insert_start),
            insert_key_sequence,
            insertion_retry_limit: properties.parse_or(
                "insertionretrylimit",
                0u32,
                "non-negative integer",
            )?,
            insertion_retry_interval: Duration::from_secs(retry_interval_secs),
            record_count,
            insert_start,
            insert_count,
        })
    }

    /// The key numbers `load` inserts: `insertstart .. insertstart + insertcount`.
    pub fn insert_range(&self) -> std::ops::Range<u64> {
        self.insert_start..self.insert_start.saturating_add(self.insert_count)
    }

    /// Checks that the transaction phase can choose keys at all.
    pub fn validate_for_run(&self) -> anyhow::Result<()> {
        if self.record_count == 0 {
            bail!("the run phase needs recordcount >= 1 (the number of loaded records)");
        }
        Ok(())
    }

    /// The table records live in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Per-thread state with its own RNG.
    pub fn thread_state(&self, rng: StdRng) -> ThreadState {
        ThreadState {
            rng,
            key_chooser: self.key_chooser.clone(),
            scan_length: self.scan_length.clone(),
            field_length: self.field_length.clone(),
        }
    }

    /// The record key of key number `key_number` (YCSB's `buildKeyName`).
    pub fn key_name(&self, key_number: u64) -> String {
        build_key_name(key_number, self.ordered_inserts, self.zero_padding)
    }

    fn next_key_number(&self, state: &mut ThreadState) -> anyhow::Result<u64> {
        let limit = self
            .insert_key_sequence
            .last_value()
            .context("no record has been loaded or inserted")?;
        for _ in 0..MAX_KEY_DRAW_ATTEMPTS {
            let key_number = match &mut state.key_chooser {
                KeyChooser::Uniform(generator) => generator.next_value(&mut state.rng),
                KeyChooser::Zipfian(generator) => generator.next_value(&mut state.rng),
                KeyChooser::Latest(generator) => generator
                    .next_value(&self.insert_key_sequence, &mut state.rng)
                    .context("no acknowledged key")?,
            };
            // YCSB compares against the limit read on every draw; it only grows.
            let current_limit = self.insert_key_sequence.last_value().unwrap_or(limit);
            if key_number <= current_limit {
                return Ok(key_number);
            }
        }
        bail!("no acknowledged key in {MAX_KEY_DRAW_ATTEMPTS} draws; check insertstart/insertcount/recordcount")
    }

    fn field_value(&self, state: &mut ThreadState) -> Vec<u8> {
        let len = match &state.field_length {
            FieldLength::Constant(len) => *len,
            FieldLength::Uniform(generator) => generator.next_value(&mut state.rng),
        };
        random_bytes(len as usize, &mut state.rng)
    }

    /// All fields with fresh random values (YCSB's `buildValues`).
    pub fn build_values(&self, state: &mut ThreadState) -> Record {
        let mut record = Record::new();
        for name in &self.field_names {
            let value = self.field_value(state);
            record.insert(name.clone(), value);
        }
        record
    }

    /// One random field with a fresh value (YCSB's `buildSingleValue`).
    fn build_single_value(&self, state: &mut ThreadState) -> Record {
        let index = self.field_chooser.next_value(&mut state.rng) as usize;
        let mut record = Record::new();
        let value = self.field_value(state);
        record.insert(self.field_names[index].clone(), value);
        record
    }

    fn update_values(&self, state: &mut ThreadState) -> Record {
        if self.write_all_fields {
            self.build_values(state)
        } else {
            self.build_single_value(state)
        }
    }

    /// The fields a read asks for: one random field, all by name, or all (`None`).
    fn read_fields(&self, state: &mut ThreadState) -> Option<Vec<String>> {
        if !self.read_all_fields {
            let index = self.field_chooser.next_value(&mut state.rng) as usize;
            Some(vec![self.field_names[index].clone()])
        } else if self.read_all_fields_by_name {
            Some(self.field_names.clone())
        } else {
            None
        }
    }

    /// One load-phase insert (YCSB's `doInsert`). Returns whether it succeeded.
    pub async fn do_insert(&self, db: &mut MeasuredDb, state: &mut ThreadState) -> bool {
        let key_number = self.key_sequence.next_value();
        let key = self.key_name(key_number);
        let values = self.build_values(state);
        let mut retries = 0;
        loop {
            match db.insert(&self.table, &key, &values).await {
                Ok(()) => return true,
                Err(error) => {
                    retries += 1;
                    if retries > self.insertion_retry_limit {
                        eprintln!(
                            "Error inserting, not retrying any more. number of attempts: {retries} insertion retry limit: {}: {error}",
                            self.insertion_retry_limit
                        );
                        return false;
                    }
                    eprintln!("Retrying insertion, retry count: {retries}: {error}");
                    // YCSB sleeps interval × uniform(0.8, 1.2) to avoid a thundering herd.
                    let factor = state.rng.gen_range(0.8..1.2);
                    tokio::time::sleep(self.insertion_retry_interval.mul_f64(factor)).await;
                }
            }
        }
    }

    /// One transaction-phase operation (YCSB's `doTransaction`). Errors only for conditions
    /// that must stop the run (the key chooser or insert counter broke an invariant); failed
    /// database calls are counted, not returned.
    pub async fn do_transaction(
        &self,
        db: &mut MeasuredDb,
        state: &mut ThreadState,
    ) -> anyhow::Result<()> {
        match self.operation_chooser.next_value(&mut state.rng) {
            Operation::Read => {
                let key = self.key_name(self.next_key_number(state)?);
                let fields = self.read_fields(state);
                let _ = db.read(&self.table, &key, fields.as_deref()).await;
            }
            Operation::Update => {
                let key = self.key_name(self.next_key_number(state)?);
                let values = self.update_values(state);
                let _ = db.update(&self.table, &key, &values).await;
            }
            Operation::Insert => {
                let key_number = self.insert_key_sequence.next_value();
                let key = self.key_name(key_number);
                let values = self.build_values(state);
                let _ = db.insert(&self.table, &key, &values).await;
                // Acknowledged even when the insert failed, as YCSB does in a `finally`.
                self.insert_key_sequence
                    .acknowledge(key_number)
                    .map_err(|error| anyhow!("insert key sequence: {error}"))?;
            }
            Operation::Scan => {
                let key = self.key_name(self.next_key_number(state)?);
                let length = match &mut state.scan_length {
                    ScanLength::Uniform(generator) => generator.next_value(&mut state.rng),
                    ScanLength::Zipfian(generator) => generator.next_value(&mut state.rng),
                };
                let fields = self.read_fields(state);
                let _ = db
                    .scan(&self.table, &key, length as usize, fields.as_deref())
                    .await;
            }
            Operation::ReadModifyWrite => {
                let key = self.key_name(self.next_key_number(state)?);
                let fields = self.read_fields(state);
                let values = self.update_values(state);
                let start = std::time::Instant::now();
                let intended = db.intended_start_or(start);
                let _ = db.read(&self.table, &key, fields.as_deref()).await;
                let _ = db.update(&self.table, &key, &values).await;
                let end = std::time::Instant::now();
                // YCSB measures the whole operation whatever its outcome, with no status.
                db.recorder().measure(
                    OpKind::ReadModifyWrite,
                    false,
                    micros_between(start, end),
                    micros_between(intended, end),
                );
            }
        }
        Ok(())
    }
}

/// YCSB's `buildKeyName`: `"user"` + the (hashed) key number, left-padded with zeros to
/// `zero_padding` digits.
pub fn build_key_name(key_number: u64, ordered_inserts: bool, zero_padding: usize) -> String {
    let value = if ordered_inserts {
        key_number.to_string()
    } else {
        // Key numbers are below 2^63 in any realistic run; Java hashes the long's bits the same
        // way for larger ones, so reinterpreting is faithful.
        fnv_hash64(key_number as i64).to_string()
    };
    let fill = zero_padding.saturating_sub(value.len());
    let mut key = String::with_capacity(4 + fill + value.len());
    key.push_str("user");
    key.extend(std::iter::repeat_n('0', fill));
    key.push_str(&value);
    key
}

/// YCSB's `RandomByteIterator` content: for every six bytes one random 32-bit integer, sliced
/// into characters `' ' + ((bits >> shift) & mask)` with the shifts and masks YCSB uses.
pub fn random_bytes<R: Rng + ?Sized>(len: usize, rng: &mut R) -> Vec<u8> {
    const SLICES: [(u32, i32); 6] = [(0, 31), (5, 63), (10, 95), (15, 31), (20, 63), (25, 95)];
    let mut out = vec![0u8; len];
    for chunk in out.chunks_mut(SLICES.len()) {
        let bits: i32 = rng.gen();
        for (byte, (shift, mask)) in chunk.iter_mut().zip(SLICES) {
            // The masked value is at most 95, so the sum fits a byte.
            *byte = b' ' + ((bits >> shift) & mask) as u8;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Hashed key names match Java YCSB with the default zero padding of 1.
    #[test]
    fn key_names_match_java() {
        assert_eq!(build_key_name(0, false, 1), "user6284781860667377211");
        assert_eq!(build_key_name(1, false, 1), "user8517097267634966620");
        assert_eq!(build_key_name(2, false, 1), "user1820151046732198393");
        assert_eq!(build_key_name(999, false, 1), "user2071219101098386137");
        assert_eq!(build_key_name(42, true, 1), "user42");
        assert_eq!(build_key_name(42, true, 5), "user00042");
    }

    /// Field bytes are in YCSB's character range and have the asked length.
    #[test]
    fn random_bytes_shape() {
        let mut rng = StdRng::seed_from_u64(11);
        let bytes = random_bytes(100, &mut rng);
        assert_eq!(bytes.len(), 100);
        assert!(bytes.iter().all(|byte| (b' '..=b' ' + 95).contains(byte)));
        assert!(random_bytes(0, &mut rng).is_empty());
    }

    fn workload(text: &str) -> CoreWorkload {
        CoreWorkload::new(&Properties::parse(text).expect("properties")).expect("workload")
    }

    /// The zipfian key space is recordcount + expectednewkeys + 1, and chosen keys never exceed
    /// the acknowledged limit.
    #[test]
    fn zipfian_key_space_and_limit() {
        let core = workload(
            "recordcount=1000\noperationcount=1000\ninsertproportion=0.05\nreadproportion=0.95\nupdateproportion=0\nrequestdistribution=zipfian\n",
        );
        match &core.key_chooser {
            KeyChooser::Zipfian(generator) => assert_eq!(generator.item_count(), 1000 + 100 + 1),
            other => panic!("unexpected chooser {other:?}"),
        }
        let mut state = core.thread_state(StdRng::seed_from_u64(3));
        for _ in 0..100_000 {
            let key_number = core.next_key_number(&mut state).expect("key");
            assert!(key_number < 1000);
        }
    }

    /// The hottest key of workload C over 1000 records draws about 3.78% of the requests.
    #[test]
    fn workload_c_hottest_key_share() {
        let core = workload(
            "recordcount=1000\noperationcount=1000\nreadproportion=1\nupdateproportion=0\nrequestdistribution=zipfian\n",
        );
        let mut state = core.thread_state(StdRng::seed_from_u64(17));
        let draws = 1_000_000;
        let mut counts = vec![0u32; 1000];
        for _ in 0..draws {
            counts[core.next_key_number(&mut state).expect("key") as usize] += 1;
        }
        let hottest = f64::from(*counts.iter().max().expect("keys")) / f64::from(draws);
        assert!(
            (0.0368..0.0400).contains(&hottest),
            "hottest share {hottest}"
        );
    }

    /// Unsupported settings are refused with a message.
    #[test]
    fn unsupported_settings_are_errors() {
        for text in [
            "requestdistribution=hotspot\nrecordcount=10\n",
            "workload=site.ycsb.workloads.TimeSeriesWorkload\n",
            "readproportion=2\n",
            "fieldcount=0\n",
        ] {
            let properties = Properties::parse(text).expect("properties");
            assert!(CoreWorkload::new(&properties).is_err(), "{text}");
        }
    }
}
