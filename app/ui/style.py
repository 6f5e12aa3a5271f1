"""The page's stylesheet, given to ``launch`` (Gradio 6 takes a page's CSS there, ``app.host.server``): Gradio's
theme variables where its defaults do not read, and the rules that keep the app's panels whole at any width.

Gradio's default theme draws subdued text (slider ends, a control's info line, the upload box's "- or -", the
footer) in #bbbbc2, 1.9:1 on white, and white on its orange primary buttons at 2.8:1 (3.6:1 in the dark theme);
WCAG AA asks 4.5:1 of text under 18 px. Its own darker steps of the same scales read: neutral-500 is 4.8:1 on
white, white on primary-700 5.2:1. Gradio also lays a File box's prompt (icon, "Drop File Here", "- or -", "Click
to Upload") for a tall box whatever height it is given: in the Debugger's boxes (120 and 100 px) its last line was
cut; in one row it fits. Panels drawn by ``visualize`` carry their own inline styles; their secondary text takes
the theme's subdued colour set here (``visualize.palette.NOTE``)."""

PAGE_CSS = """
:root {
  --body-text-color-subdued: var(--neutral-500);
  --input-placeholder-color: var(--neutral-500);
}
:root, :root.dark, :root .dark {
  --button-primary-background-fill: var(--primary-700);
  --button-primary-background-fill-hover: var(--primary-800);
  --button-primary-border-color: var(--primary-700);
  --button-primary-border-color-hover: var(--primary-800);
}
#dbg-load .wrap, #dbg-compare-load .wrap { min-height: 0; padding-top: 0; }
#dbg-load .prompt, #dbg-compare-load .prompt {
  flex-direction: row; flex-wrap: wrap; justify-content: center; gap: 0 0.4em;
}
#dbg-load .icon-wrap, #dbg-compare-load .icon-wrap { width: 24px; margin-bottom: 0; }
"""
