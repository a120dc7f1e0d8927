//! Reasoning ("thinking") spans: which markers a model uses, found from its chat template, and
//! splitting them out of a reply. The streaming side lives in [`super::stream`].
use std::fmt;
use std::str::FromStr;


/// The markers a model puts around its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningFormat {
    /// `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1, SmolLM3, GLM, MiniMax, …).
    Think,
    /// Gemma 4: `<|channel>thought\n…<channel|>`.
    Gemma4Channel,
    /// Mistral reasoning models (Magistral, Ministral 3 Reasoning): `[THINK]…[/THINK]`.
    MistralThink,
}

impl ReasoningFormat {
    pub const ALL: [ReasoningFormat; 3] =
        [ReasoningFormat::Think, ReasoningFormat::Gemma4Channel, ReasoningFormat::MistralThink];

    /// The marker that opens a reasoning span.
    pub fn open(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "<think>",
            ReasoningFormat::Gemma4Channel => "<|channel>thought",
            ReasoningFormat::MistralThink => "[THINK]",
        }
    }

    /// The marker that closes it.
    pub fn close(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "</think>",
            ReasoningFormat::Gemma4Channel => "<channel|>",
            ReasoningFormat::MistralThink => "[/THINK]",
        }
    }

    /// What is fed to the model to end its reasoning early (reasoning budgets): the closer laid
    /// out as the model's own template writes it.
    pub fn forced_close(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "\n</think>\n\n",
            ReasoningFormat::Gemma4Channel => "\n<channel|>",
            ReasoningFormat::MistralThink => "[/THINK]",
        }
    }

    /// The format a chat template writes, if it writes one.
    pub fn detect(template_source: &str) -> Option<ReasoningFormat> {
        if template_source.contains("<|channel>") {
            Some(ReasoningFormat::Gemma4Channel)
        } else if template_source.contains("<think>") {
            Some(ReasoningFormat::Think)
        } else if template_source.contains("[THINK]") {
            Some(ReasoningFormat::MistralThink)
        } else {
            None
        }
    }

    /// Whether `prompt` (rendered text, special tokens kept) ends inside an open reasoning span:
    /// templates such as Qwen3-Thinking's or DeepSeek-R1's end the generation prompt with
    /// `<think>\n`, so the reply starts inside the reasoning without an opening marker.
    pub fn prompt_opens_reasoning(self, prompt: &str) -> bool {
        match prompt.rfind(self.open()) {
            Some(open) => !prompt[open..].contains(self.close()),
            None => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "think",
            ReasoningFormat::Gemma4Channel => "gemma4",
            ReasoningFormat::MistralThink => "mistral",
        }
    }
}

impl fmt::Display for ReasoningFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReasoningFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "think" => Ok(ReasoningFormat::Think),
            "gemma4" | "channel" => Ok(ReasoningFormat::Gemma4Channel),
            "mistral" => Ok(ReasoningFormat::MistralThink),
            other => Err(format!("unknown reasoning format {other:?} (expected think, gemma4 or mistral)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_from_templates() {
        assert_eq!(ReasoningFormat::detect("{{ '<think>\\n' }}"), Some(ReasoningFormat::Think));
        assert_eq!(ReasoningFormat::detect("'<|channel>thought\\n<channel|>'"), Some(ReasoningFormat::Gemma4Channel));
        assert_eq!(ReasoningFormat::detect("[THINK]x[/THINK]"), Some(ReasoningFormat::MistralThink));
        assert_eq!(ReasoningFormat::detect("<|im_start|>"), None);
    }

    #[test]
    fn prompt_open_span() {
        let f = ReasoningFormat::Think;
        assert!(f.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!f.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!f.prompt_opens_reasoning("<|im_start|>assistant\n"));
        let g = ReasoningFormat::Gemma4Channel;
        assert!(!g.prompt_opens_reasoning("<|turn>model\n<|channel>thought\n<channel|>"));
    }
}
