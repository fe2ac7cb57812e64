"""Privacy mechanisms, pure (tensors, bytes and explicit randomness in, no engine): secure
aggregation with double masking (``secagg/``) and differential privacy (``dp/``)."""
