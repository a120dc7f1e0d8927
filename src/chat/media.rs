//! Images in chat messages (issue 15): the content parts that carry them, in the shapes clients
//! send (OpenAI `image_url` / `input_image`, Hugging Face and mlx-vlm `{type: "image", image}`,
//! Anthropic `{type: "image", source}`), and where their bytes come from: a `data:` URL (base64),
//! or, where the caller allows it, a local file (`file:` URL or path). Remote URLs are refused:
//! mlex does not fetch anything. Bytes are kept encoded; the model's processor decodes them.
use std::io::Read;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The largest image file or inline image taken (before decoding; the decoder bounds pixels).
pub const MAX_IMAGE_BYTES: usize = 64 << 20;

/// An image as a message carries it: its encoded bytes and a 64-bit hash of them.
#[derive(Debug, Clone)]
pub struct ImageData {
    pub bytes: Arc<[u8]>,
    pub hash: u64,
}

impl ImageData {
    pub fn new(bytes: Vec<u8>) -> Self {
        ImageData { hash: fnv1a64(&bytes), bytes: bytes.into() }
    }
}

impl PartialEq for ImageData {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// An image part of a message: it sits at byte `at` of the message's joined text.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageImage {
    pub at: usize,
    pub image: ImageData,
}

/// Where image parts may read their bytes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaAccess {
    /// `data:` URLs, `file:` URLs and paths (the CLI, the Node API: the caller's own files).
    LocalFiles,
    /// `data:` URLs only (the HTTP server: a client must not make it read the server's files).
    InlineOnly,
}

/// Whether a content part's `type` is an image.
pub fn is_image_part(kind: &str) -> bool {
    matches!(kind, "image_url" | "image" | "input_image")
}

/// The image of a content part whose type [`is_image_part`].
pub fn image_from_part(part: &Map<String, Value>, access: MediaAccess) -> Result<ImageData> {
    // Anthropic: {"type": "image", "source": {"type": "base64", "media_type": ..., "data": ...}}
    if let Some(source) = part.get("source") {
        return match (source.get("type").and_then(Value::as_str), source.get("data").and_then(Value::as_str)) {
            (Some("base64"), Some(data)) => decode_base64(data),
            (Some("url"), _) => Err(remote()),
            _ => Err(invalid("an image \"source\" must be {\"type\": \"base64\", \"data\": ...}")),
        };
    }
    // OpenAI: {"image_url": {"url": ...}} or {"image_url": "..."} (`imageUrl` from JavaScript);
    // Hugging Face / mlx-vlm: {"image": "..."}
    let field = ["image_url", "imageUrl", "image", "url"].iter().find_map(|k| part.get(*k));
    let url = match field {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(invalid("\"image_url\" must hold a string \"url\"")),
        },
        _ => return Err(invalid("an image part needs \"image_url\" (or \"image\"): a data: URL or a file path")),
    };
    image_from_url(url, access)
}

/// A `data:` URL, a `file:` URL or a path.
pub fn image_from_url(url: &str, access: MediaAccess) -> Result<ImageData> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest.split_once(',').ok_or_else(|| invalid("a data: URL needs a ',' before its data"))?;
        if !meta.ends_with(";base64") {
            return Err(invalid("image data: URLs must be base64 (data:image/png;base64,...)"));
        }
        return decode_base64(data);
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https:/") {
        return Err(remote());
    }
    if access == MediaAccess::InlineOnly {
        return Err(invalid("images must be sent inline here, as data: URLs (the server reads no local files)"));
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    read_file(std::path::Path::new(path))
}

/// Reads an image file, at most [`MAX_IMAGE_BYTES`].
pub fn read_file(path: &std::path::Path) -> Result<ImageData> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("reading image {}", path.display()), e))?;
    let mut bytes = vec![];
    file.take(MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading image {}", path.display()), e))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(invalid(format!("image {} is larger than {MAX_IMAGE_BYTES} bytes", path.display())));
    }
    Ok(ImageData::new(bytes))
}

fn decode_base64(data: &str) -> Result<ImageData> {
    if data.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(invalid(format!("inline image is larger than {MAX_IMAGE_BYTES} bytes")));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| invalid(format!("inline image is not valid base64: {e}")))?;
    Ok(ImageData::new(bytes))
}

fn remote() -> Error {
    invalid("remote image URLs are not fetched (mlex reads no network): send the image as a data: URL, a file path or bytes")
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}
