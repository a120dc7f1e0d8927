//! Media inputs for multimodal models (issue 15): decoding what a caller sends (image bytes) into
//! pixels, and each model's preprocessing of those pixels into the tensor its vision tower takes,
//! computed exactly as the model's Hugging Face processor computes it. Nothing here touches MLX:
//! the output is plain `Vec<f32>` plus a shape, so it is tested against the reference processor
//! without a device (tests/image_preprocess.rs).
pub mod audio;
pub mod animation;
pub mod audio_features;
pub mod gemma4;
pub mod image;
mod processor_config;
pub mod qwen;
pub mod qwen_video;

pub use audio::{decode_audio, load_audio, resample_poly, Waveform, MAX_AUDIO_BYTES};
pub use audio_features::{AudioFeatures, Gemma4AudioFeatureExtractor};
pub use gemma4::{Gemma4ImageProcessor, Gemma4VideoProcessor};
pub use qwen::{QwenImageProcessor, QwenPixels};
pub use qwen_video::QwenVideoProcessor;
pub(crate) use image::{check_png_palette, to_rgb};
pub use image::{decode_image, image_size, Gemma3ImageProcessor, PixelValues, RgbImage, MAX_IMAGE_PIXELS};
