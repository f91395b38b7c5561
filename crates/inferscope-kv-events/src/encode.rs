//! msgpack encoding of a `KVEventBatch` exactly as vLLM's msgspec structs
//! encode it: `array_like` structs (fields in declaration order, trailing
//! fields equal to their default omitted) and a tagged union whose tag, the
//! class name, is the event array's first element.
//!
//! - batch: `[ts, [event, ...], data_parallel_rank]`
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]`
//! - `["BlockRemoved", block_hashes, medium]`
//! - `["AllBlocksCleared"]`
//!
//! Block hashes are unsigned 64-bit integers (vLLM's `ExternalBlockHash`
//! is `bytes | int`); `lora_id` and `lora_name` are nil (no LoRA).

use inferscope_engine::{KvEvent, KvEventBatch};
use rmp::encode::{self as mp, ValueWriteError};

/// `medium` of every event: the engine's own KV pool, which vLLM calls `GPU`
/// (also for the cpu executor: consumers compare it with vLLM's value).
pub const MEDIUM: &str = "GPU";

/// The msgpack payload of one batch (the third frame of a message).
pub fn encode_batch(batch: &KvEventBatch) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 16 * batch.events.len());
    // Writing into a Vec cannot fail.
    write_batch(&mut out, batch).expect("msgpack into a Vec");
    out
}

fn write_batch(out: &mut Vec<u8>, batch: &KvEventBatch) -> Result<(), ValueWriteError> {
    mp::write_array_len(out, 3)?;
    mp::write_f64(out, batch.ts)?;
    mp::write_array_len(out, len(batch.events.len()))?;
    for e in &batch.events {
        write_event(out, e)?;
    }
    mp::write_uint(out, batch.engine as u64)?;
    Ok(())
}

fn write_event(out: &mut Vec<u8>, e: &KvEvent) -> Result<(), ValueWriteError> {
    match e {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
        } => {
            mp::write_array_len(out, 8)?;
            mp::write_str(out, "BlockStored")?;
            write_hashes(out, block_hashes)?;
            match parent_block_hash {
                Some(p) => mp::write_uint(out, *p).map(drop)?,
                None => nil(out)?,
            }
            mp::write_array_len(out, len(token_ids.len()))?;
            for &t in token_ids {
                mp::write_uint(out, u64::from(t))?;
            }
            mp::write_uint(out, *block_size as u64)?;
            nil(out)?; // lora_id
            mp::write_str(out, MEDIUM)?;
            nil(out)?; // lora_name
        }
        KvEvent::BlockRemoved { block_hashes } => {
            mp::write_array_len(out, 3)?;
            mp::write_str(out, "BlockRemoved")?;
            write_hashes(out, block_hashes)?;
            mp::write_str(out, MEDIUM)?;
        }
        KvEvent::AllBlocksCleared => {
            mp::write_array_len(out, 1)?;
            mp::write_str(out, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn nil(out: &mut Vec<u8>) -> Result<(), ValueWriteError> {
    mp::write_nil(out).map_err(ValueWriteError::InvalidMarkerWrite)
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64]) -> Result<(), ValueWriteError> {
    mp::write_array_len(out, len(hashes.len()))?;
    for &h in hashes {
        mp::write_uint(out, h)?;
    }
    Ok(())
}

/// msgpack array lengths are 32-bit; an engine step never holds more.
fn len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn decode(bytes: &[u8]) -> Value {
        let mut r = bytes;
        let v = rmpv::decode::read_value(&mut r).unwrap();
        assert!(r.is_empty(), "one value, nothing after it");
        v
    }

    fn arr(v: &Value) -> &[Value] {
        v.as_array().expect("an array")
    }

    #[test]
    fn batch_is_vllm_array_like_tagged() {
        let big = u64::MAX - 5;
        let batch = KvEventBatch {
            ts: 1_700_000_000.25,
            engine: 3,
            events: vec![
                KvEvent::BlockStored {
                    block_hashes: vec![big, 7],
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 3, 70_000],
                    block_size: 2,
                },
                KvEvent::BlockStored {
                    block_hashes: vec![9],
                    parent_block_hash: Some(7),
                    token_ids: vec![5, 6],
                    block_size: 2,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![big],
                },
                KvEvent::AllBlocksCleared,
            ],
        };
        let v = decode(&encode_batch(&batch));
        let top = arr(&v);
        assert_eq!(top.len(), 3, "[ts, events, data_parallel_rank]");
        assert_eq!(top[0].as_f64(), Some(1_700_000_000.25));
        assert_eq!(top[2].as_u64(), Some(3));
        let ev = arr(&top[1]);
        assert_eq!(ev.len(), 4);

        let s = arr(&ev[0]);
        assert_eq!(s.len(), 8);
        assert_eq!(s[0].as_str(), Some("BlockStored"));
        let hashes: Vec<u64> = arr(&s[1]).iter().map(|h| h.as_u64().unwrap()).collect();
        assert_eq!(hashes, vec![big, 7], "hashes keep all 64 bits");
        assert!(s[2].is_nil(), "no parent at a prompt's start");
        let toks: Vec<u64> = arr(&s[3]).iter().map(|t| t.as_u64().unwrap()).collect();
        assert_eq!(toks, vec![1, 2, 3, 70_000]);
        assert_eq!(s[4].as_u64(), Some(2));
        assert!(s[5].is_nil(), "lora_id");
        assert_eq!(s[6].as_str(), Some("GPU"));
        assert!(s[7].is_nil(), "lora_name");
        assert_eq!(arr(&ev[1])[2].as_u64(), Some(7), "parent hash");

        let r = arr(&ev[2]);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].as_str(), Some("BlockRemoved"));
        assert_eq!(arr(&r[1])[0].as_u64(), Some(big));
        assert_eq!(r[2].as_str(), Some("GPU"));

        assert_eq!(arr(&ev[3]).len(), 1);
        assert_eq!(arr(&ev[3])[0].as_str(), Some("AllBlocksCleared"));
    }
}
