"""Native torch backend: the numerical core that runs a step's ops on a transformers
Qwen2.5-VL, plus a tiny tokenizer, processor and synthetic visual task for CPU tests.

Modules (imported on demand, so importing this package does not import transformers):
- model:     build_model / save_model / load_model / set_trainable
- tokenizer: build_tokenizer / build_image_processor / encode_prompt
- (prompt records PromptInputs, PromptBatch, collate_prompts live in rollplex.data.prompts)
- task:      VisualTask (seeded coloured-shapes questions) and reward
- engine:    the per-op functions (vision_encode, prefix_forward, expand_prefix, decode,
             response_logprobs, full_logprobs, grpo_loss, group_advantages)
- roles.py / trainer.py / critic.py: the rollout, reference, trainer (and PPO critic) roles
- backend:   their builders (build_trainer / build_reference / build_rollout) and the
             step's external values as torch values (TorchExternals); routing, row chunks
             and role-free ops are the runtime's (rollplex.runtime.dispatch)
- values.py / rows.py: the value types, their row chunks and host/device moves (TorchValues)
- data.py:   task prompts per step
"""
