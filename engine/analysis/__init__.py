"""From measurements to decisions: theory, the regime verdict, the recommender and its exports. No I/O."""
