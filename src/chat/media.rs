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
    /// A frame of a video decoded by mlex (an animated image): when it is shown, `[start, end)`
    /// in seconds. `None` for images and for the frames of a frames list (which carry no times:
    /// the model's processor times them at its own fps).
    pub time: Option<[f64; 2]>,
}

impl ImageData {
    pub fn new(bytes: Vec<u8>) -> Self {
        ImageData { hash: hash_bytes(&bytes), bytes: bytes.into(), time: None }
    }

    /// A decoded video frame shown from `start` to `end` seconds.
    pub fn timed(bytes: Vec<u8>, start: f64, end: f64) -> Self {
        ImageData { time: Some([start, end]), ..ImageData::new(bytes) }
    }
}

/// A video's frame times when all its frames carry them (a video mlex decoded): each frame's
/// start (seconds) and the video's duration (the last frame's end).
pub fn video_times(frames: &[ImageData]) -> Option<(Vec<f64>, f64)> {
    let starts = frames.iter().map(|f| f.time.map(|t| t[0])).collect::<Option<Vec<f64>>>()?;
    let end = frames.last()?.time?[1];
    Some((starts, end))
}

impl PartialEq for ImageData {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

/// A 64-bit hash of `bytes`, eight at a time (FNV-1a's step on words, with a rotation so high bits
/// reach low ones), then the tail and the length. Only a prefilter: equal images are compared
/// byte for byte. Byte-at-a-time FNV-1a took ~0.4 ms of an image prompt's time to first token
/// for a 230 KB PNG (one multiply's latency per byte).
fn hash_bytes(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut words = bytes.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in &mut words {
        h = ((h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(PRIME)).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    (h ^ bytes.len() as u64).wrapping_mul(PRIME)
}

/// An image or video part of a message: it sits at byte `at` of the message's joined text.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageImage {
    pub at: usize,
    /// The image (a video part: its first frame).
    pub image: ImageData,
    /// A video part's frames, in order, each an image (`None`: an image part).
    pub video: Option<Vec<ImageData>>,
    /// An audio part: `image` holds the clip's encoded bytes (WAV, FLAC or MP3).
    pub audio: bool,
}

impl MessageImage {
    pub fn image(at: usize, image: ImageData) -> Self {
        MessageImage { at, image, video: None, audio: false }
    }

    /// An audio part: the clip's encoded bytes.
    pub fn audio(at: usize, clip: ImageData) -> Self {
        MessageImage { at, image: clip, video: None, audio: true }
    }

    /// A video part of `frames` (at least one).
    pub fn video(at: usize, frames: Vec<ImageData>) -> Self {
        MessageImage { at, image: frames[0].clone(), video: Some(frames), audio: false }
    }

    /// The part as a model binds it.
    pub fn media(&self) -> Media<'_> {
        match &self.video {
            None if self.audio => Media::Audio(&self.image),
            None => Media::Image(&self.image),
            Some(frames) => Media::Video(frames),
        }
    }
}

/// A media part as the model binds it: an image, a video's frames, or an audio clip (its
/// encoded bytes).
#[derive(Debug, Clone, Copy)]
pub enum Media<'a> {
    Image(&'a ImageData),
    Video(&'a [ImageData]),
    Audio(&'a ImageData),
}

/// The most frames a video part may hold (the models take fewer: Gemma 4 samples 32, Qwen's
/// video processor takes at most its `max_frames`, 768 by default).
pub const MAX_VIDEO_FRAMES: usize = 1024;

/// The most encoded bytes a video part's frames may hold together.
pub const MAX_VIDEO_BYTES: usize = 4 * MAX_IMAGE_BYTES;

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

/// Whether a content part's `type` is a video.
pub fn is_video_part(kind: &str) -> bool {
    matches!(kind, "video" | "input_video" | "video_url")
}

/// The frames of a content part whose type [`is_video_part`]: `{"type": "video", "video": [frame,
/// ...]}`, each frame an image source as an image part takes it (a path, a `file:` or `data:`
/// URL; bytes arrive from JavaScript as data: URLs), read as `access` allows; or one such source
/// (also `{"url": ...}`, OpenAI's shape) holding an animated GIF, WebP or PNG, decoded here into
/// timed frames ([`animated_video`]). Real video files (MP4, WebM, ...) are refused: mlex decodes
/// no video codecs.
pub fn video_from_part(part: &Map<String, Value>, access: MediaAccess) -> Result<Vec<ImageData>> {
    let field = ["video", "video_url", "videoUrl", "input_video", "url"].iter().find_map(|k| part.get(*k));
    let frames = match field {
        Some(Value::Array(frames)) => frames,
        Some(Value::String(url)) => return video_file(url, access),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(url)) => return video_file(url, access),
            _ => return Err(invalid("\"video_url\" must hold a string \"url\"")),
        },
        _ => {
            return Err(invalid(
                "a video part needs \"video\": its frames, [frame, ...], each an image, or an animated GIF, WebP or PNG",
            ))
        }
    };
    if frames.is_empty() {
        return Err(invalid("a video part needs at least one frame"));
    }
    if frames.len() > MAX_VIDEO_FRAMES {
        return Err(invalid(format!("a video part holds {} frames, more than {MAX_VIDEO_FRAMES}", frames.len())));
    }
    let mut out = Vec::with_capacity(frames.len());
    let mut bytes = 0usize;
    for (i, f) in frames.iter().enumerate() {
        let frame = match f {
            Value::String(url) => image_from_url(url, access),
            _ => Err(invalid("a frame must be an image: a path, a file: or data: URL, or bytes")),
        }
        .map_err(|e| invalid(format!("frame {i}: {}", strip(&e))))?;
        bytes += frame.bytes.len();
        if bytes > MAX_VIDEO_BYTES {
            return Err(invalid(format!("a video part's frames hold more than {MAX_VIDEO_BYTES} bytes")));
        }
        out.push(frame);
    }
    // The times of a decoded video's frames, as `content_parts_json` writes them.
    if let Some(times) = part.get("frame_times").filter(|t| !t.is_null()) {
        let bad = || invalid("\"frame_times\" must hold one [start, end] a frame, in seconds, in order");
        let times = times.as_array().filter(|t| t.len() == out.len()).ok_or_else(bad)?;
        let mut last = 0.0;
        for (f, t) in out.iter_mut().zip(times) {
            let pair = t.as_array().filter(|p| p.len() == 2).ok_or_else(bad)?;
            let (s, e) = (pair[0].as_f64().ok_or_else(bad)?, pair[1].as_f64().ok_or_else(bad)?);
            if !(s.is_finite() && e.is_finite() && s >= last && e >= s) {
                return Err(bad());
            }
            last = s;
            f.time = Some([s, e]);
        }
    }
    Ok(out)
}

/// A video part's single source: refused by its name when it names a video container (a path's
/// extension, a data: URL's `video/` type), else read and decoded by [`animated_video`].
fn video_file(url: &str, access: MediaAccess) -> Result<Vec<ImageData>> {
    use crate::media::animation::no_codec;
    let lower = url.get(..url.len().min(64)).unwrap_or(url).to_ascii_lowercase();
    let container = if let Some(mime) = lower.strip_prefix("data:video/") {
        let sub = mime.split([';', ',']).next().unwrap_or("");
        (!matches!(sub, "gif" | "webp" | "png" | "apng")).then(|| sub.to_ascii_uppercase())
    } else if url.starts_with("data:") {
        None
    } else {
        let ext = std::path::Path::new(url).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some(e @ ("mp4" | "m4v" | "mov" | "webm" | "mkv" | "avi" | "mpg" | "mpeg" | "ts" | "flv" | "ogv" | "3gp" | "wmv")) => {
                Some(e.to_ascii_uppercase())
            }
            _ => None,
        }
    };
    if let Some(c) = container {
        return Err(invalid(no_codec(&c)));
    }
    animated_video(image_from_url(url, access)?)
}

/// A video file (an animated GIF, WebP or PNG, or a still image) read from `path` and decoded
/// into its timed frames, as a video part naming the path is (a video container refused).
pub fn video_from_path(path: &std::path::Path) -> Result<Vec<ImageData>> {
    let name = path.to_str().ok_or_else(|| invalid(format!("video path {} is not UTF-8", path.display())))?;
    if name.starts_with("data:") || name.to_ascii_lowercase().starts_with("http") {
        return read_file(path).and_then(animated_video);
    }
    video_file(name, MediaAccess::LocalFiles)
}

/// A video given as one file: an animated GIF, WebP or PNG becomes its frames, each timed (see
/// [`crate::media::animation`]: at most [`MAX_VIDEO_FRAMES`] frames, [`MAX_VIDEO_BYTES`] bytes
/// of re-encoded frames); a still image is a one-frame video at time 0; a video container is
/// refused.
pub fn animated_video(file: ImageData) -> Result<Vec<ImageData>> {
    use crate::media::animation::{decode_animation, Animation};
    match decode_animation(&file.bytes, MAX_VIDEO_FRAMES, MAX_VIDEO_BYTES)? {
        Animation::Still => Ok(vec![ImageData { time: Some([0.0, 0.0]), ..file }]),
        Animation::Frames(frames) => Ok(frames.into_iter().map(|f| ImageData::timed(f.png, f.start, f.end)).collect()),
    }
}

fn strip(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
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
