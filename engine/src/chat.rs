//! Chat templates: the Jinja template stored in the GGUF (`tokenizer.chat_template`), rendered
//! with minijinja and Python-compatible string methods, as Hugging Face's `apply_chat_template`
//! would render it.

use crate::error::EngineError;
use serde::{Deserialize, Serialize};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or any role the template knows).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos` / `eos` are the texts of those tokens, which templates may use.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, EngineError> {
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        // Templates are trusted model metadata, but keep rendering bounded all the same.
        env.set_recursion_limit(64);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| EngineError::Template(format!("invalid chat template: {e}")))?;
        Ok(ChatTemplate { env, bos: bos.to_string(), eos: eos.to_string() })
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::InvalidRequest("`messages` must not be empty".into()));
        }
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(|e| EngineError::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| EngineError::Template(format!("rendering the chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_python_string_methods() {
        let t = ChatTemplate::new(CHATML, "<s>", "</s>").unwrap();
        let s = t.render(&[ChatMessage::new("user", " hi ")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn template_exceptions_become_errors() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let err = t.render(&[ChatMessage::new("user", "x")], false).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn empty_conversations_are_invalid() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        assert!(matches!(t.render(&[], true), Err(EngineError::InvalidRequest(_))));
    }
}
