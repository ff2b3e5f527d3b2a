"""challenger_model: XGBoost on Spark over image_features' embeddings, beside trained_model."""
