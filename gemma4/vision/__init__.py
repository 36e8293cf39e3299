"""Images in the prompt: the processor, the vision towers and how their vectors enter the text model."""
