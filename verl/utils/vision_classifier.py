"""A token classifier over a vision-language model's trunk: the critic of a vision-language policy.

transformers ships ``...ForTokenClassification`` classes (a trunk plus a ``score`` layer on every
position) for text models only; ``AutoModelForTokenClassification`` knows no Qwen2-VL. The critic
needs the same thing over a Qwen-VL trunk (``Qwen2VLModel``: the vision tower, the image merger and
the language model), whose forward takes the row's ``pixel_values``, ``image_grid_thw`` and
``[3, b, L]`` M-RoPE positions, so :func:`token_classifier_class` builds that class from
transformers' own parts: ``GenericForTokenClassification`` (what its text token classifiers are
made of) on the family's pre-trained base. The trunk's weights load from the vision-language
checkpoint (its LM head is left out) and ``score`` is drawn fresh, as a text critic's is.
"""

from __future__ import annotations

import functools

from transformers import PreTrainedModel


def token_classifier_class(config) -> type[PreTrainedModel]:
    """The class that loads ``config``'s checkpoint as a token classifier: transformers' own when it
    has one (every text model), else one built over the vision-language trunk
    (:func:`_vision_token_classifier`)."""
    from transformers import AutoModelForTokenClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

    if (
        type(config) in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING
        or getattr(config, "vision_config", None) is None
    ):
        return AutoModelForTokenClassification
    return _vision_token_classifier(type(config))


@functools.cache
def _vision_token_classifier(config_class: type) -> type[PreTrainedModel]:
    """``<Family>ForTokenClassification`` for a vision-language ``config_class`` (one class per
    family, so a process that loads several critics builds it once). Its checkpoint keys are read
    with the rules of the family's ``...ForConditionalGeneration`` (Qwen2-VL's hub checkpoints keep
    the older ``model.layers`` / ``visual.`` names), registered under the new class's name."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )
    from transformers.modeling_layers import GenericForTokenClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING, MODEL_MAPPING

    if config_class not in MODEL_MAPPING or config_class not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        raise ValueError(
            f"critic.model.path: {config_class.__name__} has a vision tower but transformers has no trunk "
            "or image-text-to-text class for it; a critic over a vision-language model needs both"
        )
    trunk = MODEL_MAPPING[config_class]  # e.g. Qwen2VLModel(Qwen2VLPreTrainedModel)
    base = next(c for c in trunk.__mro__[1:] if issubclass(c, PreTrainedModel))
    generation = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[config_class]
    name = generation.__name__.replace("ForConditionalGeneration", "") + "ForTokenClassification"
    cls = type(name, (GenericForTokenClassification, base), {"__module__": __name__})
    renames = get_checkpoint_conversion_mapping(generation.__name__)
    if renames is not None:
        register_checkpoint_conversion_mapping(name, renames, overwrite=True)
    return cls
