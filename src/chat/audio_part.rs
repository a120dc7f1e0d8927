//! Audio in chat messages (issue 15): the content parts that carry a clip, in the shapes clients
//! send (OpenAI `{type: "input_audio", input_audio: {data: base64, format}}`, Hugging Face and
//! mlx-vlm `{type: "audio", audio: path | URL}`, `{type: "audio_url", audio_url: {url}}`), and
//! where their bytes come from: base64, a `data:` URL, or, where the caller allows it, a local
//! file (`file:` URL or path). Remote URLs are refused. Bytes are kept encoded (WAV, FLAC, MP3):
//! the model's side decodes them (src/media/audio.rs).
use std::io::Read;

use base64::Engine as _;
use serde_json::{Map, Value};

use super::media::{ImageData, MediaAccess};
use crate::error::{Error, Result};

/// The largest encoded audio taken (a 30 s clip is ~5 MB as 16-bit stereo 44.1 kHz WAV).
pub const MAX_AUDIO_BYTES: usize = 64 << 20;

/// Whether a content part's `type` is audio.
pub fn is_audio_part(kind: &str) -> bool {
    matches!(kind, "audio" | "input_audio" | "audio_url")
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// The clip of a content part whose type [`is_audio_part`].
pub fn audio_from_part(part: &Map<String, Value>, access: MediaAccess) -> Result<ImageData> {
    // OpenAI: {"input_audio": {"data": base64, "format": "wav" | "mp3" | ...}} (`inputAudio` from JS)
    if let Some(v) = part.get("input_audio").or_else(|| part.get("inputAudio")) {
        return match v {
            Value::Object(o) => match o.get("data") {
                Some(Value::String(data)) => {
                    if let Some(f) = o.get("format") {
                        let f = f.as_str().ok_or_else(|| invalid("\"input_audio.format\" must be a string"))?;
                        if !matches!(f.to_ascii_lowercase().as_str(), "wav" | "mp3" | "flac" | "x-wav" | "wave" | "mpeg") {
                            return Err(invalid(format!("input_audio format {f:?} is not taken (wav, flac and mp3 are)")));
                        }
                    }
                    decode_base64(data)
                }
                _ => Err(invalid("\"input_audio\" needs \"data\": the clip in base64")),
            },
            Value::String(url) => audio_from_url(url, access),
            _ => Err(invalid("\"input_audio\" must be {\"data\": base64, \"format\": \"wav\"}")),
        };
    }
    let field = ["audio", "audio_url", "audioUrl", "url"].iter().find_map(|k| part.get(*k));
    let url = match field {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(invalid("\"audio_url\" must hold a string \"url\"")),
        },
        _ => return Err(invalid("an audio part needs \"audio\" (a data: URL or a file path) or \"input_audio\"")),
    };
    audio_from_url(url, access)
}

/// A `data:` URL, a `file:` URL or a path.
pub fn audio_from_url(url: &str, access: MediaAccess) -> Result<ImageData> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest.split_once(',').ok_or_else(|| invalid("a data: URL needs a ',' before its data"))?;
        if !meta.ends_with(";base64") {
            return Err(invalid("audio data: URLs must be base64 (data:audio/wav;base64,...)"));
        }
        return decode_base64(data);
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https:/") {
        return Err(invalid(
            "remote audio URLs are not fetched (mlex reads no network): send the clip as a data: URL, a file path or bytes",
        ));
    }
    if access == MediaAccess::InlineOnly {
        return Err(invalid("audio must be sent inline here, as base64 (the server reads no local files)"));
    }
    read_audio_file(std::path::Path::new(url.strip_prefix("file://").unwrap_or(url)))
}

/// Reads an audio file, at most [`MAX_AUDIO_BYTES`].
pub fn read_audio_file(path: &std::path::Path) -> Result<ImageData> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("reading audio {}", path.display()), e))?;
    let mut bytes = vec![];
    file.take(MAX_AUDIO_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading audio {}", path.display()), e))?;
    if bytes.len() > MAX_AUDIO_BYTES {
        return Err(invalid(format!("audio {} is larger than {MAX_AUDIO_BYTES} bytes", path.display())));
    }
    Ok(ImageData::new(bytes))
}

fn decode_base64(data: &str) -> Result<ImageData> {
    if data.len() / 4 * 3 > MAX_AUDIO_BYTES + 3 {
        return Err(invalid(format!("inline audio is larger than {MAX_AUDIO_BYTES} bytes")));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| invalid(format!("inline audio is not valid base64: {e}")))?;
    Ok(ImageData::new(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn part(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn openai_input_audio_and_data_urls() {
        let a = audio_from_part(&part(json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}})), MediaAccess::InlineOnly).unwrap();
        assert_eq!(&a.bytes[..], b"RIFF");
        let b = audio_from_part(&part(json!({"type": "audio", "audio": "data:audio/wav;base64,UklGRg=="})), MediaAccess::InlineOnly).unwrap();
        assert_eq!(a, b);
        for bad in [
            json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "ogg"}}),
            json!({"type": "input_audio", "input_audio": {"format": "wav"}}),
            json!({"type": "audio", "audio": "/etc/passwd"}),
            json!({"type": "audio", "audio": "https://example.com/a.wav"}),
            json!({"type": "audio"}),
        ] {
            assert!(matches!(audio_from_part(&part(bad.clone()), MediaAccess::InlineOnly), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }
}
