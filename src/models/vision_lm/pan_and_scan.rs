//! Gemma 3's pan and scan in the prompt text, as transformers' and mlx-vlm's `Gemma3Processor`
//! write it: an image the image processor cuts into crops (`Gemma3ImageProcessor::
//! pan_and_scan_boxes`) is announced by "Here is the original image {image} and here are some
//! crops to help you see better {crop} {crop} …", each `{…}` the usual image expansion
//! (`\n\n<start_of_image>` + the soft tokens + `<end_of_image>\n\n`). The tower encodes the whole
//! image, then each crop; `VisionLm::bind_media` gives each run of soft tokens its rows in order.
//!
//! The crop count comes from the image's size alone, read from its header here (before the
//! pixels are decoded for the tower), with the same arithmetic the preprocessing then uses.
//!
//! Which settings apply: the checkpoint's processor config, as in mlx-vlm, whose Gemma3Processor
//! hands the image processor nothing of its own. (transformers' Gemma3Processor passes its
//! defaults, off / 256 / 4 / 1.2, over the config's, so there pan and scan is a per-call option;
//! mlx-vlm exposes no such option, and neither does mlex.)
use super::ImagePrompt;
use crate::error::{Error, Result};

impl ImagePrompt {
    /// What the processor writes in place of one image marker for the image `bytes`: the
    /// expansion, or, with pan and scan on and an image it crops, the sentence around it.
    /// Bad image bytes are InvalidArgument (as decoding would refuse them).
    pub fn expansion_for(&self, bytes: &[u8]) -> Result<String> {
        let Some(p) = &self.pan_and_scan else { return Ok(self.expansion.clone()) };
        let (w, h) = crate::media::image_size(bytes)?;
        Ok(with_crops(&self.expansion, p.pan_and_scan_boxes(w, h).len()))
    }

    /// `text` (a rendered chat prompt holding one marker per image, in order) with each marker
    /// replaced by [`Self::expansion_for`] its image; errors name the image (1-based).
    pub fn expand_markers(&self, text: &str, images: &[&[u8]]) -> Result<String> {
        if self.pan_and_scan.is_none() {
            return Ok(text.replace(self.marker.as_str(), &self.expansion));
        }
        let pieces: Vec<&str> = text.split(self.marker.as_str()).collect();
        let mut out = String::with_capacity(text.len());
        for (k, piece) in pieces.iter().enumerate() {
            out.push_str(piece);
            if k + 1 < pieces.len() {
                let bytes = images.get(k).ok_or_else(|| {
                    Error::InvalidArgument(format!("the prompt holds more image markers ({}) than images", pieces.len() - 1))
                })?;
                let expansion = self.expansion_for(bytes).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!("image {} of the conversation: {m}", k + 1)),
                    other => other,
                })?;
                out.push_str(&expansion);
            }
        }
        Ok(out)
    }
}

/// Gemma3Processor's text for an image of `crops` pan-and-scan crops, `full` being one image's
/// expansion (`full` itself when there are none).
fn with_crops(full: &str, crops: usize) -> String {
    if crops == 0 {
        return full.to_string();
    }
    format!(
        "Here is the original image {full} and here are some crops to help you see better {}",
        vec![full; crops].join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::Gemma3ImageProcessor;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = Vec::new();
        image::RgbImage::new(w, h).write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png).unwrap();
        out
    }

    #[test]
    fn crops_take_the_processors_sentence() {
        let p = Gemma3ImageProcessor { do_pan_and_scan: true, pan_and_scan_min_crop_size: 4, ..Default::default() };
        let prompt = ImagePrompt {
            marker: "<boi>".into(),
            expansion: "[I]".into(),
            image_token: 0,
            placeholder_tokens: 1,
            video: None,
            pan_and_scan: Some(p),
        };
        let (wide, square) = (png(30, 10), png(10, 11));
        assert_eq!(prompt.expansion_for(&square).unwrap(), "[I]");
        let text = prompt.expand_markers("a<boi>b<boi>c", &[&wide, &square]).unwrap();
        assert_eq!(text, "aHere is the original image [I] and here are some crops to help you see better [I] [I] [I]b[I]c");
        let err = prompt.expand_markers("a<boi>b<boi>c", &[&wide, b"junk"]).unwrap_err().to_string();
        assert!(err.contains("image 2 of the conversation"), "{err}");
        let off = ImagePrompt { pan_and_scan: None, ..prompt };
        assert_eq!(off.expand_markers("a<boi>b", &[b"junk"]).unwrap(), "a[I]b");
    }
}
